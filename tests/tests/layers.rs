//! The host's modules form no import circle (ARCHITECTURE.md, "Layers"): read from the
//! `crate::`, `super::` and `self::` paths of `host/src`, test modules aside. A circle
//! means two modules can only be understood together; this keeps each one readable on
//! its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`writer/core`; `""` for the crate root) → source, tests cut off.
fn modules(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(root).unwrap().with_extension("");
            let mut name = relative.to_string_lossy().replace('\\', "/");
            if name == "lib" {
                name.clear();
            } else if let Some(parent) = name.strip_suffix("/mod") {
                name = parent.to_string();
            }
            let source = std::fs::read_to_string(&path).unwrap();
            let code = match source.find("#[cfg(test)]\nmod tests") {
                Some(at) => source[..at].to_string(),
                None => source,
            };
            out.insert(name, code);
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path that starts with `crate`, `super` or `self` in `code`, with `{a, b::c}`
/// groups expanded (one level deep is all the host uses), as segment lists.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts = ["crate::", "super::", "self::"].iter().any(|p| {
            chars[i..].iter().take(p.len()).copied().eq(p.chars())
                && (i == 0 || !is_ident(chars[i - 1]))
        });
        if !starts {
            i += 1;
            continue;
        }
        let mut segments = Vec::new();
        loop {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            segments.push(chars[start..i].iter().collect::<String>());
            if chars[i..].starts_with(&[':', ':']) {
                i += 2;
                if chars.get(i) == Some(&'{') {
                    let close = chars[i..]
                        .iter()
                        .position(|&c| c == '}')
                        .map_or(chars.len(), |p| i + p);
                    let group: String = chars[i + 1..close].iter().collect();
                    for item in group.split(',') {
                        let item = item.split(" as ").next().unwrap().trim();
                        if !item.is_empty() {
                            let mut path = segments.clone();
                            path.extend(item.split("::").map(str::to_string));
                            out.push(path);
                        }
                    }
                    i = close;
                    break;
                }
                continue;
            }
            out.push(segments);
            break;
        }
    }
    out
}

/// The module a path in module `from` names (the longest prefix that is a module).
fn resolve(from: &str, path: &[String], known: &BTreeMap<String, String>) -> Option<String> {
    let mut base: Vec<String> = if from.is_empty() {
        Vec::new()
    } else {
        from.split('/').map(str::to_string).collect()
    };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => base.clear(),
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
            return resolve_in(base, rest, known);
        }
        Some("self") => {}
        _ => return None,
    }
    resolve_in(base, &rest[1..], known)
}

fn resolve_in(
    base: Vec<String>,
    rest: &[String],
    known: &BTreeMap<String, String>,
) -> Option<String> {
    let mut candidate = base;
    candidate.extend(rest.iter().cloned());
    (1..=candidate.len())
        .rev()
        .map(|k| candidate[..k].join("/"))
        .find(|m| known.contains_key(m))
}

#[test]
fn the_hosts_modules_form_no_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/src");
    let known = modules(&root);
    assert!(
        known.len() > 20,
        "read {} modules of {}",
        known.len(),
        root.display()
    );
    // Module → modules it imports, parents and children aside.
    let mut imports: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &known {
        for path in paths(code) {
            if let Some(target) = resolve(module, &path, &known) {
                let related = target == *module
                    || module.starts_with(&format!("{target}/"))
                    || target.starts_with(&format!("{module}/"))
                    || target.is_empty()
                    || module.is_empty();
                if !related {
                    imports.entry(module).or_default().insert(target);
                }
            }
        }
    }
    let top = |m: &str| m.split('/').next().unwrap().to_string();
    let mut circles = Vec::new();
    for (a, targets) in &imports {
        for b in targets {
            if imports
                .get(b.as_str())
                .is_some_and(|back| back.contains(*a))
                && **a < **b
            {
                circles.push(format!("{a} <-> {b}"));
            }
            let (ta, tb) = (top(a), top(b));
            if ta != tb && ta < tb {
                let back = imports
                    .iter()
                    .any(|(m, ts)| top(m) == tb && ts.iter().any(|t| top(t) == ta));
                if back {
                    circles.push(format!("{ta} <-> {tb} (through {a} -> {b})"));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles in host/src: {circles:#?}"
    );
}

#[test]
fn the_scan_sees_a_circle() {
    // Two modules importing each other, spelled as the host spells imports.
    let mut known = BTreeMap::new();
    known.insert("a".to_string(), "use crate::b::{X, y::Z};".to_string());
    known.insert("b".to_string(), "use super::a::Y;".to_string());
    known.insert("b/y".to_string(), String::new());
    let a = paths(&known["a"]);
    assert_eq!(resolve("a", &a[0], &known).as_deref(), Some("b"));
    assert_eq!(resolve("a", &a[1], &known).as_deref(), Some("b/y"));
    let b = paths(&known["b"]);
    assert_eq!(resolve("b", &b[0], &known).as_deref(), Some("a"));
}
