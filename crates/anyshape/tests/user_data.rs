//! What the user owns is never lost: each case is a way `anyshape tune` once deleted or
//! corrupted user data (issue "Never lose what the user owns"), run as the user would.
use std::path::Path;
use std::process::{Command, Output};

const W: &str = "dense(M=T,N=64,K=64)";

fn anyshape_in(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_anyshape"));
    cmd.args(args).current_dir(dir).env("RUST_BACKTRACE", "0");
    if !envs.iter().any(|e| e.0 == "ANYSHAPE_CACHE") {
        cmd.env("ANYSHAPE_CACHE", dir.join("cache"));
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `tune` of the small workload with `extra` arguments.
fn tune(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "tune", "-w", W, "--range", "T=1..8", "--batch", "2", "--quiet",
    ];
    args.extend_from_slice(extra);
    anyshape_in(dir, &args, &[])
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Case 1: a directory with a foreign `manifest.json` is not replaced.
#[test]
fn out_never_replaces_a_directory_anyshape_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let ext = dir.path().join("ext");
    std::fs::create_dir_all(ext.join("src")).unwrap();
    std::fs::write(ext.join("manifest.json"), r#"{"name":"ext"}"#).unwrap();
    std::fs::write(ext.join("README.md"), "hi").unwrap();
    std::fs::write(ext.join("src/important.txt"), "x").unwrap();
    let o = tune(
        dir.path(),
        &["--trials", "4", "--records", "R", "--out", "ext"],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("did not write"), "{}", text(&o));
    assert_eq!(listing(&ext), ["README.md", "manifest.json", "src"]);
    assert!(!dir.path().join("R").exists(), "refused before any work");

    // A real module with a file of the user's added is not replaced either; the module
    // alone is.
    let o = tune(
        dir.path(),
        &["--trials", "4", "--records", "R", "--out", "m"],
    );
    assert!(o.status.success(), "{}", text(&o));
    std::fs::write(dir.path().join("m/notes.txt"), "mine").unwrap();
    let o = tune(
        dir.path(),
        &["--trials", "4", "--records", "R", "--resume", "--out", "m"],
    );
    assert!(
        !o.status.success() && text(&o).contains("notes.txt"),
        "{}",
        text(&o)
    );
    std::fs::remove_file(dir.path().join("m/notes.txt")).unwrap();
    let o = tune(
        dir.path(),
        &["--trials", "6", "--records", "R", "--resume", "--out", "m"],
    );
    assert!(o.status.success(), "{}", text(&o));
}

/// Case 2: `--out .` is refused, in a directory with a `manifest.json` or an empty one.
#[test]
fn out_never_replaces_the_current_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::write(cwd.join("manifest.json"), "{}").unwrap();
    std::fs::write(cwd.join("notes.txt"), "keep").unwrap();
    for out in [".", "./", "../cwd", cwd.to_str().unwrap(), ".."] {
        let o = tune(&cwd, &["--trials", "4", "--records", "R", "--out", out]);
        assert!(
            !o.status.success() && text(&o).contains("current directory"),
            "{out}: {}",
            text(&o)
        );
    }
    assert_eq!(listing(&cwd), ["manifest.json", "notes.txt"]);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = tune(
        &empty,
        &["--trials", "4", "--records", "../R", "--out", "."],
    );
    assert!(!o.status.success() && text(&o).contains("current directory"));
}

/// Case 3: records (or a report) inside `--out` are refused before any work.
#[test]
fn records_inside_out_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = tune(
        dir.path(),
        &["--trials", "4", "--records", "R", "--out", "inmod"],
    );
    assert!(o.status.success(), "{}", text(&o));
    for (records, report) in [("inmod/records.jsonl", None), ("R", Some("inmod/r.json"))] {
        let mut args = vec!["--trials", "4", "--resume", "--records", records];
        if let Some(r) = report {
            args.extend(["--report", r]);
        }
        args.extend(["--out", "inmod"]);
        let o = tune(dir.path(), &args);
        assert!(
            !o.status.success() && text(&o).contains("lies inside --out"),
            "{}",
            text(&o)
        );
    }
    assert!(!dir.path().join("inmod/records.jsonl").exists());
    // A records file inside the module (put there by hand) survives a refused run.
    std::fs::write(dir.path().join("inmod/records.jsonl"), "").unwrap();
    let o = tune(
        dir.path(),
        &[
            "--trials",
            "4",
            "--resume",
            "--records",
            "R",
            "--out",
            "inmod",
        ],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(dir.path().join("inmod/records.jsonl").exists());
}

/// Case 4: the report cannot overwrite the records; nor be a directory.
#[test]
fn report_and_records_never_alias() {
    let dir = tempfile::tempdir().unwrap();
    for report in ["same.jsonl", "./same.jsonl", "sub/../same.jsonl"] {
        let o = tune(
            dir.path(),
            &[
                "--trials",
                "4",
                "--records",
                "same.jsonl",
                "--report",
                report,
            ],
        );
        assert!(
            !o.status.success() && text(&o).contains("name the same file"),
            "{}",
            text(&o)
        );
    }
    std::fs::create_dir(dir.path().join("rep")).unwrap();
    let o = tune(
        dir.path(),
        &["--trials", "4", "--records", "R", "--report", "rep"],
    );
    assert!(!o.status.success() && text(&o).contains("is a directory"));
    assert!(!dir.path().join("R").exists(), "refused before any work");
}

/// Case 5: a last record without its trailing newline is kept on resume, not measured
/// again; a torn one is cut off and reported.
#[test]
fn the_last_record_is_kept_without_its_newline() {
    let dir = tempfile::tempdir().unwrap();
    let o = tune(dir.path(), &["--trials", "4", "--records", "R"]);
    assert!(o.status.success(), "{}", text(&o));
    let r = dir.path().join("R");
    let full = std::fs::read(&r).unwrap();
    std::fs::write(&r, &full[..full.len() - 1]).unwrap();
    let o = tune(dir.path(), &["--trials", "4", "--records", "R", "--resume"]);
    assert!(
        o.status.success() && text(&o).contains("4 resumed"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(&r).unwrap(), full);
    // Half a record: cut, reported, measured again.
    std::fs::write(&r, &full[..full.len() - 20]).unwrap();
    let o = tune(dir.path(), &["--trials", "4", "--records", "R", "--resume"]);
    let out = text(&o);
    assert!(
        o.status.success() && out.contains("torn last record") && out.contains("3 resumed"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&r).unwrap().lines().count(), 4);
}

/// Case 7: two runs on one records file: the second is refused while the first holds it.
#[test]
fn two_runs_never_share_a_records_file() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--trials", "16", "--records", "R", "--resume"];
    let spawn = || {
        let mut args2 = vec![
            "tune", "-w", W, "--range", "T=1..8", "--batch", "2", "--quiet",
        ];
        args2.extend(args);
        Command::new(env!("CARGO_BIN_EXE_anyshape"))
            .args(&args2)
            .current_dir(dir.path())
            .env("ANYSHAPE_CACHE", dir.path().join("cache"))
            .output()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(spawn);
        let b = s.spawn(spawn);
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    let refused = [&a, &b]
        .iter()
        .filter(|o| !o.status.success() && text(o).contains("in use by another anyshape run"))
        .count();
    let finished = [&a, &b].iter().filter(|o| o.status.success()).count();
    // Either one was refused while the other held the file, or they ran one after the
    // other (the second resuming the first); never both at once.
    assert_eq!(refused + finished, 2, "{}\n{}", text(&a), text(&b));
    let content = std::fs::read_to_string(dir.path().join("R")).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for line in content.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            seen.insert((v["micro_kernel"].to_string(), v["bindings"].to_string())),
            "duplicate trial: {line}"
        );
    }
}

/// Case 8: a compile the environment stops (the compiler killed) is recorded as such,
/// stops the run with an environment error, and is measured on resume, not counted as a
/// failed candidate.
#[test]
fn a_killed_compiler_is_not_the_candidates_fault() {
    let dir = tempfile::tempdir().unwrap();
    let cc = dir.path().join("killed-cc");
    std::fs::write(
        &cc,
        "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in *.c) if grep -q '^int32_t as_' \"$a\"; then kill -9 $$; fi;; esac; done\nexec cc \"$@\"\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cc, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let args = [
        "tune",
        "-w",
        W,
        "--range",
        "T=1..8",
        "--batch",
        "2",
        "--quiet",
        "--trials",
        "6",
        "--records",
        "R",
        "--resume",
    ];
    let o = anyshape_in(dir.path(), &args, &[("CC", cc.to_str().unwrap())]);
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("outside the candidates") && out.contains("killed"),
        "{out}"
    );
    let records = std::fs::read_to_string(dir.path().join("R")).unwrap();
    assert!(
        records.lines().count() > 0 && records.lines().all(|l| l.contains("\"transient\"")),
        "{records}"
    );
    let o = anyshape_in(dir.path(), &args, &[]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("measured again") && out.contains("0 failed") && out.contains("trials 6"),
        "{out}"
    );
}

/// Case 9: a damaged kernel cache entry is rebuilt with a warning; an empty
/// `ANYSHAPE_CACHE` means the default cache, never the current directory.
#[test]
fn the_kernel_cache_heals() {
    let dir = tempfile::tempdir().unwrap();
    let run = |envs: &[(&str, &str)]| {
        anyshape_in(
            dir.path(),
            &["run", "-w", W, "--set", "T=5", "--seconds", "0", "--check"],
            envs,
        )
    };
    assert!(run(&[]).status.success());
    for e in std::fs::read_dir(dir.path().join("cache")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "so") {
            let len = std::fs::metadata(&p).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }
    }
    let o = run(&[]);
    let out = text(&o);
    assert!(
        o.status.success() && out.contains("damaged") && out.contains("check        ok"),
        "{out}"
    );
    let home = dir.path().join("home");
    let o = run(&[
        ("ANYSHAPE_CACHE", ""),
        ("HOME", home.to_str().unwrap()),
        ("XDG_CACHE_HOME", ""),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(home.join(".cache/anyshape").is_dir());
    assert!(listing(dir.path()).iter().all(|f| !f.ends_with(".so")));
}

/// Inputs that used to abort or be taken silently: a huge shape for `bench --overhead`,
/// a manifest whose domain is 10^18 values, weights of 1e308, records of another
/// workload, outside the domain or with impossible latencies.
#[test]
fn odd_module_records_and_weights_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let o = tune(d, &["--trials", "4", "--records", "R", "--out", "m"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = anyshape_in(
        d,
        &[
            "bench",
            "--module",
            "m",
            "--overhead",
            "--set",
            "T=100000000000",
        ],
        &[],
    );
    assert!(
        !o.status.success() && text(&o).contains("the machine has"),
        "{}",
        text(&o)
    );
    // A manifest sealed with a domain of 10^18 values (its checksum is no signature).
    let path = d.join("m/manifest.json");
    let mut m: anyshape_abi::Manifest =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m.shape_vars[0].domain = anyshape_ir::Domain::Range {
        lo: 1,
        hi: 1_000_000_000_000_000_000,
    };
    m.seal();
    anyshape_abi::write_manifest(&m, &d.join("m")).unwrap();
    let o = anyshape_in(d, &["inspect", "m"], &[]);
    assert!(
        o.status.success() && text(&o).contains("1000000000000000000 values"),
        "{}",
        text(&o)
    );
    // Weights of 1e308 on every value: normalized, no NaN anywhere.
    std::fs::write(
        d.join("w.json"),
        r#"{"T": {"1": 1e308, "2": 1e308, "8": 1e308}}"#,
    )
    .unwrap();
    let o = tune(
        d,
        &["--trials", "4", "--records", "R2", "--weights", "w.json"],
    );
    let out = text(&o);
    assert!(o.status.success() && !out.contains("NaN"), "{out}");
    // Records of another workload, outside the domain, with impossible latencies.
    let mut lines: Vec<String> = std::fs::read_to_string(d.join("R"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let n = lines.len();
    let first = lines[0].clone();
    lines.push(first.replace("dense(M=T,N=64,K=64)", "dense(M=T,N=32,K=64)"));
    lines.push(first.replace(r#""T":"#, r#""T":10"#));
    let mut zero: serde_json::Value = serde_json::from_str(&first).unwrap();
    zero["result"]["measured"]["min_seconds"] = 0.0.into();
    lines.push(zero.to_string());
    std::fs::write(d.join("R"), lines.join("\n") + "\n").unwrap();
    let o = tune(d, &["--trials", "4", "--records", "R", "--resume"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for needle in [
        "1 records of another workload".to_string(),
        "1 records outside the domain".to_string(),
        format!(
            "line {} skipped: latency 0 s is not a positive number",
            n + 3
        ),
        format!("{n} resumed"),
    ] {
        assert!(out.contains(&needle), "`{needle}` in {out}");
    }
}

/// The tuning database: a `--db` that is not anyshape's tuning database (a file of the
/// user's, an empty file, the records file, a file inside `--out`) is refused before any
/// work and left as it was; the default one lives in the kernel cache, and a second run
/// with new records starts from the first run's trials there instead of measuring again.
#[test]
fn the_tuning_database_is_never_a_users_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("notes.txt"), "mine").unwrap();
    std::fs::write(d.join("empty.db"), "").unwrap();
    std::fs::create_dir(d.join("m")).unwrap();
    for (db, out, says) in [
        ("notes.txt", None, "not an SQLite file"),
        ("empty.db", None, "not an SQLite file"),
        ("R", None, "name the same file"),
        ("m/tuning.sqlite", Some("m"), "lies inside --out m"),
    ] {
        let mut args = vec!["--trials", "4", "--records", "R", "--db", db];
        args.extend(out.iter().flat_map(|o| ["--out", o]));
        let o = tune(d, &args);
        assert!(!o.status.success(), "--db {db}: {}", text(&o));
        assert!(text(&o).contains(says), "--db {db}: {}", text(&o));
    }
    assert_eq!(
        std::fs::read_to_string(d.join("notes.txt")).unwrap(),
        "mine"
    );
    assert_eq!(std::fs::read(d.join("empty.db")).unwrap(), b"");
    assert!(!d.join("m/tuning.sqlite").exists() && !d.join("R").exists());

    // The default database, in the kernel cache: the second run reuses the first's.
    let o = tune(d, &["--trials", "6", "--records", "R1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(d.join("cache/tuning.sqlite").is_file());
    let o = tune(d, &["--trials", "6", "--records", "R2"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("6 trials reused from the tuning database"),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("trials 6 (6 resumed"), "{}", text(&o));
    // --no-db: the records alone.
    let o = tune(d, &["--trials", "6", "--records", "R3", "--no-db"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("trials 6 (0 resumed"), "{}", text(&o));
}
