//! Tidy: the invariants of ARCHITECTURE.md that `cargo metadata` and the sources can show,
//! checked on every `cargo test` (in the manner of rust-analyzer's tidy test).
//!
//! - The crates depend on each other only downwards (`ALLOWED_DEPENDENCIES`, for every kind of
//!   dependency): ebb-core on nothing at all (but its tests' dev-dependencies), ebb-sim and ebb-runtime never on each other, nothing on ebb-fuse or
//!   ebb-cli. A new crate must be added to the table.
//! - Only ebb-cli depends on `anyhow` or writes to stdout (`println!`, `print!`, `stdout()` in
//!   another crate's `src/`).
//! - Only ebb-core sequences a writer's call: no other crate (sources, tests, examples) calls
//!   `balance_dirty_pages`, `wait_for_page`, `throttle_continue` or `inode_dirtied`; drivers
//!   use the writer protocol (`Engine::writer_step`).
//! - Every constant a module's constants table names (an `UPPER_SNAKE` entry of a table whose
//!   header starts `| name |`) is a `const` of its crate.
//! - No source file is longer than `LINES_MAX` lines outside its tests (files under `tests/`,
//!   files named `tests.rs`, and everything from a file's `#[cfg(test)]` on do not count), but
//!   the files of `RATCHET`, which may not grow and leave the list once split.
//! - No circle inside a crate, at any depth: the children of each module (the crate root's
//!   top-level modules, `config`'s `knobs` and `registry`, ...), with an arrow from one to
//!   another when code inside the first names the second or anything in it (`crate::a::b`,
//!   `super::b`, `self::b`, `b::x` for a child `b`, outside comments and tests), form no cycle,
//!   but the modules of `CYCLES_LEFT`, which may only become fewer. ebb-core's files name
//!   what they use: no `use super::*` outside tests. In ebb-core only `engine/` implements `Engine`:
//!   the controllers (flusher, reclaim, wbt, ...) own their state and the engine drives them,
//!   so no `impl Engine` elsewhere reaches back into the engine's fields.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What each workspace crate may depend on (normal, build and dev dependencies alike).
const ALLOWED_DEPENDENCIES: &[(&str, &[&str])] = &[
    ("ebb-core", &[]),
    ("ebb-backend", &["ebb-core"]),
    ("ebb-sim", &["ebb-core", "ebb-backend"]),
    ("ebb-runtime", &["ebb-core", "ebb-backend"]),
    ("ebb-fuse", &["ebb-core", "ebb-backend", "ebb-runtime"]),
    ("ebb-cli", &["ebb-core", "ebb-backend", "ebb-sim", "ebb-runtime", "ebb-fuse"]),
];

/// The most lines a source file may have outside its tests.
const LINES_MAX: usize = 800;

/// Files over [`LINES_MAX`] not split yet, with the most lines they may have: they may shrink,
/// not grow past it, and must leave this list once under the budget (issue 19).
const RATCHET: &[(&str, usize)] = &[];

/// Constants a table names that are not defined yet (each must leave the list once defined).
const CONSTANTS_MISSING: &[(&str, &str)] = &[];

/// Crates whose modules still form cycles, with the modules in them by path (`config::knobs`):
/// the list may only shrink (a module leaving a cycle leaves it, a crate without cycles leaves
/// the list).
const CYCLES_LEFT: &[(&str, &[&str])] = &[];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// `path` relative to the workspace root, with `/` separators.
fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).to_string_lossy().replace('\\', "/")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The workspace's crates: name and directory.
fn crates(root: &Path) -> Vec<(String, PathBuf)> {
    let mut crates: Vec<(String, PathBuf)> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|entry| entry.expect("crate directory").path())
        .filter(|path| path.join("Cargo.toml").exists())
        .map(|path| (path.file_name().unwrap().to_string_lossy().into_owned(), path))
        .collect();
    crates.sort();
    crates
}

/// The workspace's packages from `cargo metadata`: name and its dependencies, each with its
/// kind (`normal`, `build` or `dev`).
fn packages() -> BTreeMap<String, BTreeSet<(String, String)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    packages
        .iter()
        .map(|package| {
            let name = package["name"].as_str().expect("name").to_owned();
            let dependencies = package["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .map(|dependency| {
                    let name = dependency["name"].as_str().expect("name").to_owned();
                    let kind = dependency["kind"].as_str().unwrap_or("normal").to_owned();
                    (name, kind)
                })
                .collect();
            (name, dependencies)
        })
        .collect()
}

#[test]
fn crates_depend_only_downwards() {
    let packages = packages();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED_DEPENDENCIES.iter().copied().collect();
    let mut wrong = Vec::new();
    for (name, dependencies) in &packages {
        let Some(allowed) = allowed.get(name.as_str()) else {
            wrong.push(format!("{name} is not in ALLOWED_DEPENDENCIES (tests/tidy.rs)"));
            continue;
        };
        for (dependency, kind) in dependencies {
            let ours = packages.contains_key(dependency);
            if ours && !allowed.contains(&dependency.as_str()) {
                wrong.push(format!("{name} depends on {dependency} ({kind})"));
            }
            if name == "ebb-core" && kind != "dev" {
                wrong.push(format!("ebb-core depends on {dependency}: it depends on nothing"));
            }
        }
    }
    assert!(wrong.is_empty(), "dependencies against ARCHITECTURE.md:\n{}", wrong.join("\n"));
}

#[test]
fn only_the_cli_uses_anyhow() {
    let users: Vec<String> = packages()
        .into_iter()
        .filter(|(name, dependencies)| {
            name != "ebb-cli" && dependencies.iter().any(|(dependency, _)| dependency == "anyhow")
        })
        .map(|(name, _)| name)
        .collect();
    assert!(users.is_empty(), "anyhow outside ebb-cli: {users:?}");
}

#[test]
fn only_the_cli_writes_to_stdout() {
    let root = workspace_root();
    let mut found = Vec::new();
    for (name, dir) in crates(&root) {
        if name == "ebb-cli" {
            continue;
        }
        for file in rust_files(&dir.join("src")) {
            let text = std::fs::read_to_string(&file).expect("read source");
            for (index, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if ["println!", "print!", "stdout()"].iter().any(|call| calls(code, call)) {
                    found.push(format!(
                        "{}:{}: {}",
                        relative(&root, &file),
                        index + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "stdout outside ebb-cli:\n{}", found.join("\n"));
}

/// Whether `code` has `call` as a word of its own (`print!`, not `eprint!`).
fn calls(code: &str, call: &str) -> bool {
    code.match_indices(call)
        .any(|(at, _)| !code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
}

/// The `UPPER_SNAKE` names of the constants tables in a module's doc (`//! | name | ...`).
fn table_constants(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            in_table = false;
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with("| name |") {
            in_table = true;
        } else if in_table && doc.starts_with('|') {
            let name = doc.trim_start_matches('|').split('|').next().unwrap_or("").trim();
            let name = name.trim_matches('`');
            let constant = name.len() > 1
                && name.starts_with(|c: char| c.is_ascii_uppercase())
                && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if constant {
                names.push(name.to_owned());
            }
        } else {
            in_table = false;
        }
    }
    names
}

/// The names of the `const` items in `text`.
fn constants(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace().skip_while(|word| *word != "const").skip(1);
        if let Some(word) = words.next() {
            let name: String =
                word.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            names.insert(name);
        }
    }
    names
}

#[test]
fn constants_tables_name_real_constants() {
    let root = workspace_root();
    let mut missing = BTreeSet::new();
    for (_, dir) in crates(&root) {
        let files = rust_files(&dir.join("src"));
        let texts: Vec<(PathBuf, String)> = files
            .into_iter()
            .map(|file| {
                let text = std::fs::read_to_string(&file).expect("read source");
                (file, text)
            })
            .collect();
        let defined: BTreeSet<String> =
            texts.iter().flat_map(|(_, text)| constants(text)).collect();
        for (file, text) in &texts {
            for name in table_constants(text) {
                if !defined.contains(&name) {
                    missing.insert((relative(&root, file), name));
                }
            }
        }
    }
    let known: BTreeSet<(String, String)> = CONSTANTS_MISSING
        .iter()
        .map(|(file, name)| ((*file).to_owned(), (*name).to_owned()))
        .collect();
    let new: Vec<_> = missing.difference(&known).collect();
    let defined_now: Vec<_> = known.difference(&missing).collect();
    assert!(new.is_empty(), "named in a constants table, but no const of the crate: {new:?}");
    assert!(
        defined_now.is_empty(),
        "defined now: take them off CONSTANTS_MISSING: {defined_now:?}"
    );
}

/// The lines of `text` before its `#[cfg(test)]`, if any.
fn lines_outside_tests(text: &str) -> usize {
    text.lines().take_while(|line| !line.starts_with("#[cfg(test)]")).count()
}

#[test]
fn source_files_stay_within_the_budget() {
    let root = workspace_root();
    let ratchet: BTreeMap<&str, usize> = RATCHET.iter().copied().collect();
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for (_, dir) in crates(&root) {
        for sub in ["src", "examples", "benches"] {
            for file in rust_files(&dir.join(sub)) {
                if file.file_name().is_some_and(|name| name == "tests.rs") {
                    continue;
                }
                let path = relative(&root, &file);
                let lines = lines_outside_tests(&std::fs::read_to_string(&file).expect("read"));
                match ratchet.get(path.as_str()) {
                    Some(&max) => {
                        seen.insert(path.clone());
                        if lines > max {
                            wrong.push(format!("{path}: {lines} lines, grew past its {max}"));
                        } else if lines <= LINES_MAX {
                            wrong.push(format!("{path}: {lines} lines, take it off RATCHET"));
                        }
                    }
                    None if lines > LINES_MAX => {
                        wrong.push(format!(
                            "{path}: {lines} lines, more than {LINES_MAX}: split it"
                        ));
                    }
                    None => {}
                }
            }
        }
    }
    for (path, _) in RATCHET {
        if !seen.contains(*path) {
            wrong.push(format!("{path} is gone: take it off RATCHET"));
        }
    }
    assert!(wrong.is_empty(), "file sizes (tests/tidy.rs):\n{}", wrong.join("\n"));
}

/// A module's path, as its names from the crate root (`[]` for the root).
type ModPath = Vec<String>;

/// The module a source file under `src` defines: `a/b.rs` and `a/b/mod.rs` are `a::b`,
/// `lib.rs` and `main.rs` the root.
fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: ModPath =
        rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    if !["mod", "lib", "main"].contains(&stem) || !parts.is_empty() && stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The leading identifier of `s` (after blanks).
fn ident(s: &str) -> String {
    s.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

/// The items of a `{...}` group whose text starts just after the `{`, up to its `}`.
fn group_items(group: &str) -> Vec<&str> {
    let (mut level, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => level += 1,
            '}' if level == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => level -= 1,
            ',' if level == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

/// Reads the rest of a path after `prefix::` (names and `{...}` groups): every path it spells.
fn spell(rest: &str, prefix: ModPath, out: &mut Vec<ModPath>) {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        for item in group_items(group) {
            spell(item, prefix.clone(), out);
        }
        return;
    }
    let name = ident(rest);
    if name.is_empty() || name == "self" {
        out.push(prefix);
        return;
    }
    let after = &rest.trim_start()[name.len()..];
    let mut path = prefix;
    path.push(name);
    match after.strip_prefix("::") {
        Some(after) => spell(after, path, out),
        None => out.push(path),
    }
}

/// The paths `code` (of module `at`, whose child modules are `children`) names, made absolute:
/// `crate::a::b`, `super::a` (any number of `super`s), `self::a` and `child::a`, with groups
/// (`crate::{a::X, b::{Y, Z}}`) read as several paths.
fn named_paths(code: &str, at: &[String], children: &BTreeSet<String>) -> Vec<ModPath> {
    let mut out = Vec::new();
    let word_before = |at: usize| {
        code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    };
    for (i, _) in code.match_indices("::") {
        let start = code[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let first = &code[start..i];
        if first.is_empty() || code[..start].ends_with("::") || word_before(start) {
            continue;
        }
        let mut rest = &code[i + 2..];
        let base: ModPath = match first {
            "crate" => Vec::new(),
            "self" => at.to_vec(),
            "super" => {
                let mut ups = 1;
                while let Some(r) = rest.strip_prefix("super::") {
                    rest = r;
                    ups += 1;
                }
                at[..at.len().saturating_sub(ups)].to_vec()
            }
            child if children.contains(child) => {
                let mut base = at.to_vec();
                base.push(child.to_owned());
                base
            }
            _ => continue,
        };
        spell(rest, base, &mut out);
    }
    out
}

/// A crate's module graph at every depth: for each module with submodules, an arrow between
/// two of its children when code inside the first (at any depth) names the second or anything
/// inside it (outside comments and tests). A child naming its parent's items, or a parent its
/// children's, is no arrow: only siblings can form a circle.
fn module_graphs(src: &Path) -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let files: Vec<(ModPath, PathBuf)> =
        rust_files(src).into_iter().map(|file| (module_path(src, &file), file)).collect();
    let modules: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for module in modules.iter().filter(|m| !m.is_empty()) {
        let (parent, name) = module.split_at(module.len() - 1);
        graphs.entry(parent.to_vec()).or_default().entry(name[0].clone()).or_default();
    }
    for (at, file) in &files {
        if file.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let children: BTreeSet<String> = modules
            .iter()
            .filter(|m| m.len() == at.len() + 1 && m.starts_with(at))
            .map(|m| m[at.len()].clone())
            .collect();
        let text = std::fs::read_to_string(file).expect("read source");
        let code: String = text
            .lines()
            .take_while(|line| !line.starts_with("#[cfg(test)]"))
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for path in named_paths(&code, at, &children) {
            // The module it names: the longest prefix of the path that is a module.
            let Some(target) =
                (0..=path.len()).rev().map(|n| &path[..n]).find(|p| modules.contains(*p))
            else {
                continue;
            };
            let common = at.iter().zip(target).take_while(|(a, b)| a == b).count();
            if common < at.len() && common < target.len() {
                let siblings = graphs.get_mut(&at[..common]).expect("parent module");
                siblings.get_mut(&at[common]).expect("module").insert(target[common].clone());
            }
        }
    }
    graphs
}

/// The modules of `graph` that lie on a cycle, each with one cycle through it.
fn modules_in_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, Vec<String>> {
    let mut found = BTreeMap::new();
    for start in graph.keys() {
        // Breadth first from `start`, remembering how each module was reached, back to `start`.
        let mut from: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(module) = queue.pop_front() {
            for next in &graph[module] {
                if next == start {
                    let mut back = Vec::new();
                    let mut at = module;
                    while at != start {
                        back.push(at.clone());
                        at = from[at];
                    }
                    let mut cycle = vec![start.clone()];
                    cycle.extend(back.into_iter().rev());
                    cycle.push(start.clone());
                    found.insert(start.clone(), cycle);
                    queue.clear();
                    break;
                }
                if !from.contains_key(next) {
                    from.insert(next, module);
                    queue.push_back(next);
                }
            }
        }
    }
    found
}

/// Every module of a crate on a circle among its siblings, by its full path (`config::knobs`),
/// with one circle through it.
fn crate_cycles(src: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for (parent, graph) in module_graphs(src) {
        let full = |name: &str| {
            parent.iter().map(String::as_str).chain([name]).collect::<Vec<_>>().join("::")
        };
        for (module, cycle) in modules_in_cycles(&graph) {
            let cycle: Vec<String> = cycle.iter().map(|m| full(m)).collect();
            found.insert(full(&module), cycle.join(" -> "));
        }
    }
    found
}

#[test]
fn module_graph_reads_paths_and_finds_cycles() {
    let code = "use crate::{a::X, b::{Y, c::Z}};\nuse crate::c;\n\
                fn f() { super::d::g(); super::super::e::h(); self::k::x(); kid::y(); std::kid::z(); }";
    let kids: BTreeSet<String> = ["kid".to_owned()].into();
    let at: ModPath = vec!["m".to_owned(), "n".to_owned()];
    let paths: BTreeSet<String> =
        named_paths(code, &at, &kids).into_iter().map(|p| p.join("::")).collect();
    let want = ["a::X", "b::Y", "b::c::Z", "c", "m::d::g", "e::h", "m::n::k::x", "m::n::kid::y"];
    assert_eq!(paths, want.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>());
    let src = Path::new("/s/src");
    assert_eq!(module_path(src, Path::new("/s/src/lib.rs")), ModPath::new());
    assert_eq!(module_path(src, Path::new("/s/src/a/mod.rs")), ["a"]);
    assert_eq!(module_path(src, Path::new("/s/src/a/b.rs")), ["a", "b"]);
    let graph: BTreeMap<String, BTreeSet<String>> =
        [("a", &["b"][..]), ("b", &["c"][..]), ("c", &["a", "d"][..]), ("d", &[][..])]
            .into_iter()
            .map(|(m, to)| (m.to_owned(), to.iter().map(|t| (*t).to_owned()).collect()))
            .collect();
    let cycles = modules_in_cycles(&graph);
    assert_eq!(cycles.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(cycles["a"], ["a", "b", "c", "a"]);
}

/// A circle two levels down (`config::knobs` <-> `config::registry` in a crate of its own) is
/// found, and one through the parent (`config` naming its child, the child `super::`) is not.
#[test]
fn circles_are_found_at_every_depth() {
    let dir = std::env::temp_dir().join(format!("ebb-tidy-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("config")).unwrap();
    let write = |path: &str, text: &str| std::fs::write(src.join(path), text).unwrap();
    write("lib.rs", "mod config;\n");
    write("config/mod.rs", "mod knobs;\nmod registry;\npub use knobs::Knob;\nstruct C;\n");
    write("config/knobs.rs", "use super::C;\npub struct Knob(super::registry::Entry);\n");
    write("config/registry.rs", "pub struct Entry;\nfn f() { crate::config::knobs::Knob; }\n");
    let cycles = crate_cycles(&src);
    assert_eq!(cycles.keys().collect::<Vec<_>>(), ["config::knobs", "config::registry"]);
    write("config/registry.rs", "pub struct Entry;\n");
    assert!(crate_cycles(&src).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_circle_inside_a_crate() {
    let root = workspace_root();
    let left: BTreeMap<&str, &[&str]> = CYCLES_LEFT.iter().copied().collect();
    let mut wrong = Vec::new();
    for (name, dir) in crates(&root) {
        let cycles = crate_cycles(&dir.join("src"));
        let allowed: BTreeSet<&str> =
            left.get(name.as_str()).copied().unwrap_or(&[]).iter().copied().collect();
        for (module, cycle) in &cycles {
            if !allowed.contains(module.as_str()) {
                wrong.push(format!("{name}: {cycle}"));
            }
        }
        for module in &allowed {
            if !cycles.contains_key(*module) {
                wrong.push(format!("{name}: {module} is on no cycle now: take it off CYCLES_LEFT"));
            }
        }
    }
    assert!(wrong.is_empty(), "module cycles (tests/tidy.rs):\n{}", wrong.join("\n"));
}

/// ebb-core's files say what they use: no `use super::*` outside tests (a test module may
/// take everything of the module it tests).
#[test]
fn no_glob_import_of_the_parent_in_the_core() {
    let root = workspace_root();
    let mut found = Vec::new();
    for file in rust_files(&root.join("crates/ebb-core/src")) {
        if file.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        for (index, line) in text.lines().enumerate() {
            if line.starts_with("#[cfg(test)]") {
                break;
            }
            let code = line.split("//").next().unwrap_or("");
            if code.contains("super::*") {
                found.push(format!("{}:{}: {}", relative(&root, &file), index + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "`use super::*` in ebb-core (name what you use):\n{}",
        found.join("\n")
    );
}

#[test]
fn only_the_engine_implements_engine() {
    let root = workspace_root();
    let src = root.join("crates/ebb-core/src");
    let mut found = Vec::new();
    for file in rust_files(&src) {
        let path = relative(&root, &file);
        if path.ends_with("src/engine.rs") || path.contains("src/engine/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        for (index, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("impl Engine") || line.contains("impl crate::Engine") {
                found.push(format!("{path}:{}", index + 1));
            }
        }
    }
    assert!(found.is_empty(), "impl Engine outside ebb-core's engine/:\n{}", found.join("\n"));
}

/// The engine functions a writer's call is made of, which only ebb-core calls: every other
/// crate goes through the writer protocol (`Engine::writer_step`, `Engine::writer_write`).
const WRITER_CALL_INTERNALS: &[&str] =
    &["balance_dirty_pages", "wait_for_page", "throttle_continue", "inode_dirtied"];

/// The writer-call internal `line` calls (`.name(` or `::name(`, outside a comment), if any.
fn calls_a_writer_internal(line: &str) -> Option<&'static str> {
    let code = line.split("//").next().unwrap_or("");
    WRITER_CALL_INTERNALS.iter().copied().find(|name| {
        code.match_indices(&format!("{name}(")).any(|(at, _)| {
            let before = &code[..at];
            before.ends_with('.') || before.ends_with("::")
        })
    })
}

#[test]
fn only_ebb_core_sequences_a_writer_call() {
    assert_eq!(
        calls_a_writer_internal("e.balance_dirty_pages(now, w, maps)"),
        Some("balance_dirty_pages")
    );
    assert_eq!(
        calls_a_writer_internal("Engine::throttle_continue(&mut e, now)"),
        Some("throttle_continue")
    );
    assert_eq!(
        calls_a_writer_internal("let name = \"ebb_balance_dirty_pages_pause_seconds\";"),
        None
    );
    assert_eq!(calls_a_writer_internal("// then e.wait_for_page(..)"), None);
    let root = workspace_root();
    let mut found = Vec::new();
    for (name, dir) in crates(&root) {
        if name == "ebb-core" {
            continue;
        }
        for file in rust_files(&dir) {
            if file.ends_with("tests/tidy.rs") {
                continue; // its examples above
            }
            let text = std::fs::read_to_string(&file).expect("read source");
            for (index, line) in text.lines().enumerate() {
                if let Some(call) = calls_a_writer_internal(line) {
                    found.push(format!("{}:{}: {call}", relative(&root, &file), index + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a writer's call sequenced outside ebb-core (use Engine::writer_step):\n{}",
        found.join("\n")
    );
}

/// The policy enums, whose variants are compared only inside their own module (ebb-core's
/// config), by exhaustive matches: everywhere else asks them a question (a method), so that a
/// new variant is a compile error wherever something must decide what it does.
const POLICY_ENUMS: &[&str] =
    &["ThrottlePolicy", "ReclaimPolicy", "UnstableAccounting", "CounterReads", "WbtMode"];

/// Whether `line` compares a value with a policy enum's variant by `==` or `!=`.
fn compares_a_policy(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    let is_variant =
        |token: &str| POLICY_ENUMS.iter().any(|name| token.contains(&format!("{name}::")));
    let operands = code.split("==").flat_map(|part| part.split("!=")).collect::<Vec<_>>();
    operands.windows(2).any(|pair| {
        let before = pair[0].split_whitespace().next_back().unwrap_or("");
        let after = pair[1].split_whitespace().next().unwrap_or("");
        is_variant(before) || is_variant(after)
    })
}

#[test]
fn policies_are_matched_not_compared() {
    assert!(compares_a_policy("if self.cfg.throttle == crate::config::ThrottlePolicy::Ioless {"));
    assert!(compares_a_policy("let max = (t != ebb_core::ThrottlePolicy::Ioless).then("));
    assert!(!compares_a_policy("assert_eq!(c.throttle, ThrottlePolicy::Legacy);"));
    assert!(!compares_a_policy("ThrottlePolicy::Ioless => a == b,"));
    let root = workspace_root();
    let mut found = Vec::new();
    for (_, dir) in crates(&root) {
        for file in rust_files(&dir.join("src")) {
            let path = relative(&root, &file);
            if path.ends_with("ebb-core/src/config/mod.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("read source");
            let code = text.split("\n#[cfg(test)]").next().unwrap_or(&text);
            for (index, line) in code.lines().enumerate() {
                if compares_a_policy(line) {
                    found.push(format!("{path}:{}: {}", index + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "policy enums compared with ==/!= (use a method):\n{}",
        found.join("\n")
    );
}

/// README.md reads in five minutes (at most 1,500 words), every file it links to exists, and
/// .ci/run runs scripts/readme-commands, which runs every command of its sh blocks.
#[test]
fn readme_reads_in_five_minutes() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let words = readme.split_whitespace().count();
    assert!(words <= 1500, "README.md has {words} words; at most 1,500 (move details to docs/)");
    let mut rest = readme.as_str();
    while let Some(start) = rest.find("](") {
        rest = &rest[start + 2..];
        let target = &rest[..rest.find(')').expect("a link's closing parenthesis")];
        if !target.contains("://") {
            let path = target.split('#').next().unwrap_or_default();
            assert!(root.join(path).exists(), "README.md links to {target}, which is missing");
        }
    }
    assert!(readme.contains("```sh"), "README.md has no commands");
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim().trim_start_matches("timeout -k 30 15m ") == "scripts/readme-commands"),
        ".ci/run lacks it"
    );
    assert!(root.join("scripts/readme-commands").exists());
}
