//! The container image's build, without Docker: the `Dockerfile`'s build
//! stage replayed on a scratch copy of the build context (what
//! `.dockerignore` lets through). Its `COPY` lines are applied in order,
//! and each `RUN` that calls `cargo build` runs its shell steps before the
//! build (the stubs of the dependency stage, the `touch` of the final one)
//! and, except the last, those after it (removing the stubs). Where the
//! image runs `cargo build --release --locked --bins`, the test checks that
//! every workspace member and path dependency is there, runs `cargo
//! metadata --locked --offline` (the lockfile resolves unchanged), checks
//! that every lib and bin target exists, and runs `cargo check --bins
//! --locked --offline` in the target directory the tests were built in
//! (13 s of checking the two crates once the dependencies are checked, on
//! a 2-core machine).
//!
//! `cargo check --bins` compiles exactly the non-test code of the binaries,
//! so an `include_str!`, `include_bytes!` or `#[path]` module of theirs that
//! reads a file outside the context fails it; the two `include_str!`s of
//! `examples/` (src/policy/burn.rs, src/sim/objectives.rs) are in
//! `#[cfg(test)]` modules.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

use crate::scratch::Scratch;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// What the image's build stage does to its context, in order.
#[derive(Debug)]
enum Step {
    Copy {
        srcs: Vec<String>,
        dest: String,
    },
    /// A `RUN` that calls `cargo build`: the shell steps before and after it.
    Build {
        before: String,
        after: String,
    },
}

/// The Dockerfile's instructions (keyword, arguments): continuation lines
/// joined, comments dropped.
fn instructions(dockerfile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (keyword, args) = current
            .split_once(char::is_whitespace)
            .unwrap_or((&current, ""));
        out.push((keyword.to_uppercase(), args.trim().to_owned()));
        current.clear();
    }
    out
}

/// The steps of the first stage (the build, up to the second `FROM`).
fn build_stage(dockerfile: &str) -> Vec<Step> {
    let all = instructions(dockerfile);
    let stage = all
        .iter()
        .skip_while(|i| i.0 != "FROM")
        .skip(1)
        .take_while(|i| i.0 != "FROM");
    let mut steps = Vec::new();
    for (keyword, args) in stage {
        match keyword.as_str() {
            "COPY" => steps.push(copy_step(args)),
            "RUN" if args.contains("cargo build") => steps.push(build_step(args)),
            "WORKDIR" => assert!(steps.is_empty(), "WORKDIR after a COPY is not replayed"),
            _ => {} // the toolchain's packages, ARG, ENV
        }
    }
    steps
}

fn copy_step(args: &str) -> Step {
    assert!(
        !args.starts_with('['),
        "COPY {args}: the JSON form is not replayed"
    );
    let words: Vec<&str> = args.split_whitespace().collect();
    assert!(
        !words.iter().any(|w| w.starts_with("--from")),
        "COPY {args}: --from in the build stage"
    );
    let mut paths: Vec<String> = words
        .iter()
        .filter(|w| !w.starts_with("--"))
        .map(|w| (*w).to_owned())
        .collect();
    let dest = paths
        .pop()
        .unwrap_or_else(|| panic!("COPY {args}: no destination"));
    assert!(
        !paths.is_empty() && !dest.starts_with('/'),
        "COPY {args}: sources and a relative destination"
    );
    Step::Copy { srcs: paths, dest }
}

fn build_step(args: &str) -> Step {
    let parts: Vec<&str> = args.split("&&").map(str::trim).collect();
    let at = parts
        .iter()
        .position(|p| p.starts_with("cargo build"))
        .expect("a `cargo build` step");
    Step::Build {
        before: parts[..at].join(" && "),
        after: parts[at + 1..].join(" && "),
    }
}

/// `.dockerignore`: patterns relative to the context root (`*` and `?`
/// within a name, `**` across directories, `!` for an exception, the last
/// match wins); a pattern that matches a directory excludes all it holds.
struct Ignore(Vec<(bool, Vec<String>)>);

impl Ignore {
    fn parse(text: &str) -> Self {
        let rules = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        Self(
            rules
                .map(|l| {
                    assert!(
                        !l.contains(['[', '\\']),
                        ".dockerignore {l}: classes and escapes are not replayed"
                    );
                    let (exception, pattern) =
                        l.strip_prefix('!').map_or((false, l), |p| (true, p));
                    let segments = pattern
                        .trim_matches('/')
                        .split('/')
                        .map(str::to_owned)
                        .collect();
                    (exception, segments)
                })
                .collect(),
        )
    }

    fn excludes(&self, rel: &str) -> bool {
        let path: Vec<&str> = rel.split('/').collect();
        let mut excluded = false;
        for (exception, pattern) in &self.0 {
            if (1..=path.len()).any(|n| glob(pattern, &path[..n])) {
                excluded = !exception;
            }
        }
        excluded
    }
}

fn glob(pattern: &[String], path: &[&str]) -> bool {
    match (pattern.split_first(), path.split_first()) {
        (None, None) => true,
        (Some((p, rest)), _) if p == "**" => {
            glob(rest, path) || (!path.is_empty() && glob(pattern, &path[1..]))
        }
        (Some((p, rest)), Some((s, path_rest))) => {
            name_glob(p.as_bytes(), s.as_bytes()) && glob(rest, path_rest)
        }
        _ => false,
    }
}

fn name_glob(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| name_glob(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && name_glob(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && name_glob(rest, &name[1..]),
    }
}

/// `COPY srcs... dest`: a directory's contents go into `dest`, a file into
/// `dest` when it ends with `/` (or there are several sources), else to it.
fn copy(ctx: &Path, ignore: &Ignore, srcs: &[String], dest: &str) {
    let into_dir = dest.ends_with('/') || srcs.len() > 1;
    for src in srcs {
        let rel = src.trim_start_matches("./").trim_end_matches('/');
        assert!(
            !rel.contains(['*', '?']),
            "COPY {src}: wildcards are not replayed"
        );
        assert!(
            !ignore.excludes(rel),
            "COPY {src}: .dockerignore leaves it out of the build context, so `docker build` fails"
        );
        let from = repo().join(rel);
        assert!(from.exists(), "COPY {src}: no such file in the repository");
        let mut to = ctx.join(dest);
        if from.is_file() && into_dir {
            to.push(from.file_name().unwrap());
        }
        copy_tree(&from, rel, &to, ignore);
    }
}

fn copy_tree(from: &Path, rel: &str, to: &Path, ignore: &Ignore) {
    if ignore.excludes(rel) {
        return;
    }
    if from.is_file() {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{rel}: {e}"));
        return;
    }
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let name = entry.unwrap().file_name();
        let name = name.to_str().unwrap();
        copy_tree(
            &from.join(name),
            &format!("{rel}/{name}"),
            &to.join(name),
            ignore,
        );
    }
}

fn sh(ctx: &Path, script: &str) {
    if script.is_empty() {
        return;
    }
    let out = Command::new("sh")
        .args(["-ec", script])
        .current_dir(ctx)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{script}`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The shared target directory (the dependencies are checked there once).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn cargo(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .env("CARGO_INCREMENTAL", "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(stderr)
    }
}

fn host() -> String {
    let out = Command::new("rustc").arg("-vV").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

/// A workspace as `cargo metadata` sees it: each member's directory
/// (relative to the root) and lib and bin targets, and the directories of
/// the members' path dependencies.
#[derive(Debug, Default)]
struct Workspace {
    members: Vec<(String, String, Vec<String>)>,
    path_deps: Vec<(String, String)>,
}

fn workspace(metadata: &str) -> Workspace {
    let m: Value = serde_json::from_str(metadata).unwrap();
    let root = m["workspace_root"].as_str().unwrap().to_owned() + "/";
    let rel = |p: &str| p.strip_prefix(&root).unwrap_or(p).to_owned();
    let members = m["workspace_members"].as_array().unwrap();
    let mut ws = Workspace::default();
    for p in m["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| members.contains(&p["id"]))
    {
        let dir = rel(Path::new(p["manifest_path"].as_str().unwrap())
            .parent()
            .unwrap()
            .to_str()
            .unwrap());
        let targets = p["targets"].as_array().unwrap().iter();
        let targets = targets.filter(|t| t["kind"][0] == "lib" || t["kind"][0] == "bin");
        let targets = targets
            .map(|t| rel(t["src_path"].as_str().unwrap()))
            .collect();
        ws.members
            .push((p["name"].as_str().unwrap().to_owned(), dir, targets));
        for d in p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["path"].is_string())
        {
            ws.path_deps.push((
                d["name"].as_str().unwrap().to_owned(),
                rel(d["path"].as_str().unwrap()),
            ));
        }
    }
    ws.members.sort();
    ws
}

/// What `cargo build --release --locked --bins` needs at this point of the
/// image's build.
fn check_stage(ctx: &Path, stage: &str, want: &Workspace) {
    assert_manifests(ctx, stage, want);
    let t = Instant::now();
    // The host's packages only: the lockfile also lists other platforms'
    // crates, which `--offline` cannot fetch and the image does not need.
    let host = host();
    let args = [
        "metadata",
        "--locked",
        "--offline",
        "--format-version",
        "1",
        "--filter-platform",
        &host,
    ];
    let got = cargo(ctx, &args).unwrap_or_else(|e| panic!("{stage}: cargo metadata: {e}"));
    eprintln!("{stage}: cargo metadata in {:.1?}", t.elapsed());
    assert_targets(ctx, stage, want, &workspace(&got));
    let t = Instant::now();
    cargo(ctx, &["check", "--bins", "--locked", "--offline"])
        .unwrap_or_else(|e| panic!("{stage}: cargo check --bins: {e}"));
    eprintln!("{stage}: cargo check --bins in {:.1?}", t.elapsed());
}

/// Every workspace member's and path dependency's manifest is in the context.
fn assert_manifests(ctx: &Path, stage: &str, want: &Workspace) {
    let members = want
        .members
        .iter()
        .map(|(name, dir, _)| (format!("workspace member {name}"), dir));
    let deps = want
        .path_deps
        .iter()
        .map(|(name, dir)| (format!("path dependency {name}"), dir));
    for (what, dir) in members.chain(deps) {
        let manifest = Path::new(dir).join("Cargo.toml");
        assert!(
            ctx.join(&manifest).is_file(),
            "{stage}: the image's build has no {} ({what}): the Dockerfile must COPY it before this `cargo build`",
            manifest.display()
        );
    }
}

/// Every member has its lib and bin targets (stubbed or real) in the context.
fn assert_targets(ctx: &Path, stage: &str, want: &Workspace, got: &Workspace) {
    for (name, _, targets) in &want.members {
        let have = got.members.iter().find(|m| &m.0 == name).map(|m| &m.2);
        assert_eq!(have, Some(targets), "{stage}: {name}'s lib and bin targets");
        let missing: Vec<_> = targets
            .iter()
            .filter(|src| !ctx.join(src).is_file())
            .collect();
        assert!(
            missing.is_empty(),
            "{stage}: {name}'s target sources {missing:?} are missing"
        );
    }
}

/// Replays the build stage on a scratch context, checking each `cargo build`.
#[test]
fn the_dockerfile_builds_every_crate_from_its_context() {
    let repo_metadata = cargo(
        repo(),
        &[
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ],
    );
    let want = workspace(&repo_metadata.unwrap());
    assert!(want.members.len() >= 2, "{want:?}");
    let steps = build_stage(&read("Dockerfile"));
    let ignore = Ignore::parse(&read(".dockerignore"));
    let builds = steps
        .iter()
        .filter(|s| matches!(s, Step::Build { .. }))
        .count();
    assert_eq!(
        builds, 2,
        "a dependency stage and the final build: {steps:?}"
    );
    let ctx = Scratch::new("docker-context");
    let mut seen = 0;
    for step in &steps {
        match step {
            Step::Copy { srcs, dest } => copy(&ctx, &ignore, srcs, dest),
            Step::Build { before, after } => {
                seen += 1;
                sh(&ctx, before);
                let stage = if seen < builds {
                    "the dependency stage"
                } else {
                    "the final build"
                };
                check_stage(&ctx, stage, &want);
                if seen < builds {
                    sh(&ctx, after);
                }
            }
        }
    }
}

#[test]
fn dockerignore_patterns_match_as_docker_does() {
    let ignore = Ignore::parse("target/\n*.md\n/docs\nsrc/**/*.bak\n!src/keep.bak\n# a comment\n");
    for excluded in [
        "target",
        "target/debug/x",
        "README.md",
        "docs/install.md",
        "src/a/b.bak",
        "src/b.bak",
    ] {
        assert!(ignore.excludes(excluded), "{excluded}");
    }
    for kept in [
        "crates/lanes/README.md",
        "src/main.rs",
        "src/keep.bak",
        "targets",
        "# a comment",
    ] {
        assert!(!ignore.excludes(kept), "{kept}");
    }
}
