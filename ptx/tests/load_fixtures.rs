//! Every committed NVRTC fixture decodes: the whitelist of supported PTX covers all of them.

use towerpack_ptx::Module;

#[test]
fn every_fixture_loads() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "ptx") {
            let text = std::fs::read_to_string(&path).unwrap();
            let m = Module::load(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for k in m.kernels() {
                println!(
                    "{}: {} ({} instructions)",
                    path.display(),
                    k.name(),
                    k.instruction_count()
                );
            }
            count += 1;
        }
    }
    assert!(count >= 12, "found {count} fixtures");
}
