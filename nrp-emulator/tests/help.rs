//! The `nrp-emulator` binary describes itself: its `--help` names the emulator, not another part of
//! clb (its description once came from the crate it shared with the sync worker).

use std::process::Command;

#[test]
fn help_describes_the_emulator_not_the_sync_worker() {
    let out = Command::new(env!("CARGO_BIN_EXE_nrp-emulator"))
        .arg("--help")
        .output()
        .expect("nrp-emulator runs");
    assert!(out.status.success(), "--help exits with {:?}", out.status);
    let help = String::from_utf8(out.stdout).expect("--help prints UTF-8");
    let lower = help.to_lowercase();
    assert!(
        lower.contains("emulator"),
        "--help does not say emulator:\n{help}"
    );
    assert!(
        lower.contains("service gateway"),
        "--help does not name the API:\n{help}"
    );
    assert!(
        !lower.contains("sync worker"),
        "--help describes the sync worker:\n{help}"
    );
    assert!(
        help.contains("--listen"),
        "--help lists no --listen:\n{help}"
    );
}
