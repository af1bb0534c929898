//! Registers and static shared memory per thread block as `ptxas -v` reports them, when
//! `ptxas` can be found: `TOWERPACK_PTXAS`, then `ptxas` on the `PATH`, then the
//! `nvidia-cuda-nvcc-cu12` wheel of `python3`. Optional: without it the report says `null`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// What ptxas reports for one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtxasReport {
    pub registers: u32,
    pub shared_bytes: u32,
}

/// The ptxas executable, if one is found (looked up once).
pub fn ptxas() -> Option<&'static PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND.get_or_init(find).as_ref()
}

fn works(p: &PathBuf) -> bool {
    Command::new(p)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TOWERPACK_PTXAS") {
        return Some(PathBuf::from(p)).filter(works);
    }
    let on_path = PathBuf::from("ptxas");
    if works(&on_path) {
        return Some(on_path);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Some(PathBuf::from(dir).join("bin").join("ptxas")).filter(works)
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// Assembles `ptx` for `sm` (e.g. `sm_90`) and returns ptxas's report of `entry`, or `None`
/// when ptxas is missing or fails.
pub fn assemble(ptx: &str, sm: &str, entry: &str) -> Option<PtxasReport> {
    let exe = ptxas()?;
    let dir = std::env::temp_dir().join(format!(
        "towerpack-ptxas-{}-{}",
        std::process::id(),
        std::thread::current()
            .name()
            .unwrap_or("t")
            .replace(['/', ':'], "_")
    ));
    std::fs::create_dir_all(&dir).ok()?;
    let file = dir.join("k.ptx");
    std::fs::write(&file, ptx).ok()?;
    let out = Command::new(exe)
        .arg(format!("-arch={sm}"))
        .arg("-v")
        .arg(&file)
        .arg("-o")
        .arg(dir.join("k.cubin"))
        .output()
        .ok();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.filter(|o| o.status.success())?;
    let log = String::from_utf8_lossy(&out.stderr);
    let mut current = false;
    for line in log.lines() {
        if line.contains("Compiling entry function") {
            current = line.contains(&format!("'{entry}'"));
        }
        if current && line.contains("Used") && line.contains("registers") {
            return Some(PtxasReport {
                registers: number_before(line, "registers")?,
                shared_bytes: number_before(line, "bytes smem").unwrap_or(0),
            });
        }
    }
    None
}
