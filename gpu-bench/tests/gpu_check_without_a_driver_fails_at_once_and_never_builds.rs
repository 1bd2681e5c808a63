//! `scripts/gpu-check.sh --prebuilt DIR` on a machine without a GPU driver: it fails at once with
//! a clear message, and never calls cargo, neither when cargo is missing from `PATH` nor when a
//! `cargo` is there (a stand-in that records being called).
//!
//! The bundle folder holds the real `phasetrace-gpu-bench` (its `--probe` is what finds no
//! driver) and stand-ins for the test executables that record being called: none may run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check.sh")
}

fn bench() -> &'static str {
    env!("CARGO_BIN_EXE_phasetrace-gpu-bench")
}

/// A shell stand-in that appends its name to `marker` when run.
fn stand_in(path: &Path, marker: &Path) {
    std::fs::write(
        path,
        format!(
            "#!/bin/sh\necho \"$0 $*\" >> '{}'\nexit 0\n",
            marker.display()
        ),
    )
    .unwrap();
    let mut perm = std::fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(path, perm).unwrap();
}

/// A folder of links to the tools the script uses, and nothing else (no cargo).
fn tools_without_cargo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for tool in [
        "bash", "sh", "env", "mktemp", "rm", "mkdir", "ln", "ls", "sort", "tail", "head", "cat",
        "sed", "grep", "awk", "timeout", "dirname", "printf", "cut", "getconf",
    ] {
        for base in ["/usr/bin", "/bin"] {
            let src = Path::new(base).join(tool);
            if src.exists() {
                let _ = std::os::unix::fs::symlink(&src, dir.join(tool));
                break;
            }
        }
    }
}

fn has_driver() -> bool {
    Command::new(bench())
        .arg("--probe")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn without_a_driver_the_prebuilt_check_fails_at_once_and_never_builds() {
    if has_driver() {
        println!("skipped: a CUDA driver is present here (scripts/gpu-check.sh runs for real)");
        return;
    }
    let tmp = std::env::temp_dir().join(format!("phasetrace-gpu-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let bundle = tmp.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    let marker = tmp.join("called");
    std::fs::copy(bench(), bundle.join("phasetrace-gpu-bench")).unwrap();
    stand_in(&bundle.join("phasetrace-lib-tests"), &marker);
    stand_in(&bundle.join("phasetrace-it-tests"), &marker);
    let bin = tmp.join("bin");
    tools_without_cargo(&bin);
    let with_fake_cargo = tmp.join("bin-fake-cargo");
    std::fs::create_dir_all(&with_fake_cargo).unwrap();
    stand_in(&with_fake_cargo.join("cargo"), &marker);

    let paths = [
        bin.display().to_string(),
        format!("{}:{}", with_fake_cargo.display(), bin.display()),
    ];
    for path in paths {
        let t0 = Instant::now();
        let out = Command::new(bin.join("bash"))
            .arg(script())
            .arg("--prebuilt")
            .arg(&bundle)
            .env_clear()
            .env("PATH", &path)
            .env("LD_LIBRARY_PATH", "")
            .output()
            .unwrap();
        let took = t0.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "PATH={path}\n{stderr}");
        assert!(
            stderr.contains("error: no usable NVIDIA GPU here: CUDA is unavailable")
                && stderr.contains("libcuda"),
            "the message names what is missing:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        // "At once" is what the marker shows (nothing was built or run); the time bound only
        // catches a hang or a build, so it is loose enough for a starved machine.
        assert!(
            took < Duration::from_secs(120),
            "it failed after {took:?}, not at once"
        );
        assert!(
            !marker.exists(),
            "nothing may be built or run: {}",
            std::fs::read_to_string(&marker).unwrap_or_default()
        );
    }

    // A folder that is not a bundle is refused by name.
    let out = Command::new(bin.join("bash"))
        .arg(script())
        .arg("--prebuilt")
        .arg(tmp.join("nowhere"))
        .env_clear()
        .env("PATH", bin.display().to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("nowhere: no such folder"), "{stderr}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// With stand-ins that behave like the bundle on a GPU machine, the script runs each step once
/// and prints one table of every test verdict and figure; a missed goal fails the check.
#[test]
fn the_prebuilt_check_prints_one_table_of_every_figure() {
    let tmp = std::env::temp_dir().join(format!("phasetrace-gpu-table-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let bin = tmp.join("bin");
    tools_without_cargo(&bin);
    for (verdict, code) in [("met", 0), ("MISSED", 1)] {
        let bundle = tmp.join(format!("bundle-{verdict}"));
        std::fs::create_dir_all(&bundle).unwrap();
        let write = |name: &str, body: String| {
            let p = bundle.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
            let mut perm = std::fs::metadata(&p).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
            std::fs::set_permissions(&p, perm).unwrap();
        };
        write(
            "phasetrace-gpu-bench",
            format!(
                "[ \"$1\" = --probe ] && {{ echo 'device 0: Stand-in GPU'; exit 0; }}\n\
                 printf 'FIGURE\\ttokens/s graph events clock\\t990.0 (0.990x)\\t>= 0.98x\\t{verdict}\\n'\n"
            ),
        );
        write(
            "phasetrace-lib-tests",
            "[ \"$PHASETRACE_GPU\" = 1 ] || exit 9\necho \"test timing::cuda::tests::probe ... ok\"\n"
                .into(),
        );
        write(
            "phasetrace-it-tests",
            "printf 'FIGURE\\tsync vs events, 4x memset\\t1.01\\twithin 5 %%\\tmet\\n'\n\
             echo 'test gpu_backends_agree::graph ... ok'\n"
                .into(),
        );
        let out = Command::new(bin.join("bash"))
            .arg(script())
            .arg("--prebuilt")
            .arg(&bundle)
            .env_clear()
            .env("PATH", bin.display().to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stdout}\n{stderr}");
        let table: Vec<&str> = stdout
            .lines()
            .skip_while(|l| !l.starts_with("figure"))
            .collect();
        assert_eq!(table.len(), 5, "header, two tests, two figures:\n{stdout}");
        assert!(table[1].starts_with("test timing::cuda::tests::probe") && table[1].contains("ok"));
        assert!(
            table
                .iter()
                .any(|l| l.starts_with("sync vs events, 4x memset")
                    && l.contains("1.01")
                    && l.ends_with("met"))
        );
        assert!(
            table
                .iter()
                .any(|l| l.starts_with("tokens/s graph events clock")
                    && l.contains(">= 0.98x")
                    && l.ends_with(verdict))
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
