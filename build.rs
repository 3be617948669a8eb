//! Generates the gRPC code for every API we speak, and a redacting `Debug` for
//! every message that carries a secret.
//!
//! prost derives `Debug` for each message, which would print CSI secrets into
//! any log line that formats a request. The protos mark those fields with
//! `(csi_secret) = true` (or `(vg_csi_secret) = true`), and CSI says
//! `mount_flags` may be sensitive too. We find those fields in the .proto text,
//! tell prost not to derive `Debug` for their messages, and emit a `Debug`
//! that prints every other field and only the count of sensitive entries.
//!
//! It also sets `SNAP_CSI_VERSION`, the version and commit `--version` and
//! each service's start line name (the `build-info` crate).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const PROTOS: &[&str] = &[
    "proto/csi/v1/csi.proto",
    "proto/nvidia/storage/plugins/v1/storage_plugin.proto",
    "proto/volumegroup/volumegroup.proto",
    "proto/snapcsi/dpu/v1/dpu_agent.proto",
];

/// Fields that are sensitive without carrying a secret option.
const ALSO_SENSITIVE: &[(&str, &str)] = &[
    ("csi.v1.VolumeCapability.MountVolume", "mount_flags"),
    // Our own API carries NodeStage's secrets to the DPU agent.
    ("snapcsi.dpu.v1.AttachRequest", "secrets"),
];

const SECRET_OPTIONS: &[&str] = &["(csi_secret) = true", "(vg_csi_secret) = true"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    build_info::emit_version();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut messages = Vec::new();
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
        messages.extend(parse_messages(Path::new(proto))?);
    }
    let sensitive: Vec<&Message> = messages
        .iter()
        .filter(|m| m.fields.iter().any(|f| f.sensitive))
        .collect();

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .skip_debug(sensitive.iter().map(|m| format!(".{}", m.full_name)))
        .compile_protos(PROTOS, &["proto"])?;

    std::fs::write(
        out_dir.join("redacted_debug.rs"),
        render_debug_impls(&sensitive),
    )?;
    Ok(())
}

#[derive(Debug)]
struct Message {
    /// `package.Outer.Inner`.
    full_name: String,
    /// Path of the generated type from the crate's `proto` module.
    rust_path: String,
    fields: Vec<Field>,
}

#[derive(Debug)]
struct Field {
    name: String,
    sensitive: bool,
}

/// Reads messages and their top-level fields from a .proto file written in the
/// one-declaration-per-line style our protos use. Oneofs count as one field
/// named after the oneof, as in the generated struct.
fn parse_messages(path: &Path) -> Result<Vec<Message>, Box<dyn std::error::Error>> {
    enum Block {
        Message(usize),
        Other,
    }
    let text = std::fs::read_to_string(path)?;
    let mut package = String::new();
    let mut stack: Vec<Block> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut messages: Vec<Message> = Vec::new();
    let mut also: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (message, field) in ALSO_SENSITIVE {
        also.entry(message).or_default().push(field);
    }

    for statement in statements(&text) {
        let line = statement.as_str();
        if let Some(rest) = line.strip_prefix("package ") {
            package = rest.trim_end_matches(';').trim().to_string();
            continue;
        }
        let opens = line.ends_with('{');
        let closes = line.starts_with('}');
        if closes {
            if let Some(Block::Message(_)) = stack.pop() {
                names.pop();
            }
            continue;
        }
        if opens {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.first().copied() {
                Some("message") => {
                    names.push(words[1].to_string());
                    let full_name = format!("{package}.{}", names.join("."));
                    messages.push(Message {
                        rust_path: rust_path(&package, &names),
                        full_name,
                        fields: Vec::new(),
                    });
                    stack.push(Block::Message(messages.len() - 1));
                }
                Some("oneof") => {
                    if let Some(Block::Message(index)) = stack.last() {
                        messages[*index].fields.push(Field {
                            name: words[1].to_string(),
                            sensitive: false,
                        });
                    }
                    stack.push(Block::Other);
                }
                _ => stack.push(Block::Other),
            }
            continue;
        }
        // A field declaration: `[repeated] type name = N [options];`
        let Some(Block::Message(index)) = stack.last() else {
            continue;
        };
        let Some((decl, _)) = line.split_once('=') else {
            continue;
        };
        let Some(name) = decl.split_whitespace().last() else {
            continue;
        };
        let decl_start = decl.trim_start();
        if ["option ", "reserved", "["]
            .iter()
            .any(|p| decl_start.starts_with(p))
        {
            continue;
        }
        let message = &mut messages[*index];
        let sensitive = SECRET_OPTIONS.iter().any(|o| line.contains(o))
            || also
                .get(message.full_name.as_str())
                .is_some_and(|fields| fields.contains(&name));
        message.fields.push(Field {
            name: name.to_string(),
            sensitive,
        });
    }
    Ok(messages)
}

/// The file's declarations one per item, comments dropped and declarations
/// that wrap over several lines (long options) joined.
fn statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for raw in text.lines() {
        let line = raw.split("//").next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(line);
        if current.ends_with(';') || current.ends_with('{') || current.ends_with('}') {
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

/// `csi.v1` + `[VolumeCapability, MountVolume]` -> `csi::v1::volume_capability::MountVolume`.
fn rust_path(package: &str, names: &[String]) -> String {
    let mut parts: Vec<String> = package.split('.').map(str::to_string).collect();
    for outer in &names[..names.len() - 1] {
        parts.push(snake_case(outer));
    }
    parts.push(names[names.len() - 1].clone());
    parts.join("::")
}

fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn rust_field(name: &str) -> String {
    match name {
        "type" => "r#type".to_string(),
        _ => name.to_string(),
    }
}

fn render_debug_impls(messages: &[&Message]) -> String {
    let mut out =
        String::from("// Generated by build.rs: Debug that never prints sensitive fields.\n");
    for message in messages {
        let short = message.rust_path.rsplit("::").next().unwrap_or_default();
        let _ = writeln!(
            out,
            "impl ::core::fmt::Debug for {} {{\n    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{\n        f.debug_struct(\"{short}\")",
            message.rust_path
        );
        for field in &message.fields {
            let ident = rust_field(&field.name);
            if field.sensitive {
                let _ = writeln!(
                    out,
                    "            .field(\"{}\", &crate::proto::Redacted(self.{ident}.len()))",
                    field.name
                );
            } else {
                let _ = writeln!(out, "            .field(\"{}\", &self.{ident})", field.name);
            }
        }
        out.push_str("            .finish()\n    }\n}\n");
    }
    out
}
