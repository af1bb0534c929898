//! The `towerpack` command: `check FILE` and `fmt FILE` on the textual IR.

fn main() {
    eprintln!("towerpack: the textual IR tools are not built yet");
    std::process::exit(2);
}
