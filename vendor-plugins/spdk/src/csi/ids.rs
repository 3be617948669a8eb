//! The ids the controller hands out, all derived from CSI names, so that a
//! CreateVolume or CreateSnapshot retried after a restart finds its earlier
//! work in the backend by name alone, with nothing remembered.
//!
//! - volume: `<backend>-<slug>` (`aio-pvc-0b9a...`, `nvmf-pvc-0b9a...`)
//! - snapshot: `snap-<backend>-<slug>`
//! - volume group: `group-<slug>`
//! - group snapshot: `gsnap-<backend>-<slug>`; each member's snapshot is a
//!   snapshot id (`snap-<backend>-...`) whose slug is hashed from the group
//!   snapshot's name and the member's volume id in a namespace of its own, so
//!   no CreateSnapshot name can take it.
//!
//! `<slug>` is the name itself when it is 1 to [`MAX_PLAIN`] bytes of
//! `[A-Za-z0-9-]` (Kubernetes' `pvc-<uuid>` and `snapshot-<uuid>` names are),
//! else up to [`HASHED_PREFIX`] bytes of the name with every other byte turned
//! into `-`, then `_`, then the 32 hex digits of the UUID v5 of the whole
//! name. Plain slugs hold no `_` and hashed ones exactly one, so no plain name
//! can take a hashed name's slug. Every id is at most 62 bytes of
//! `[A-Za-z0-9_-]`: it is a valid SPDK lvol name (63 bytes at most) and the
//! sample plugin's device names made from it stay readable.
//!
//! The backend in the id tells every later call (delete, expand, snapshot)
//! where the volume is without looking. Changing anything here orphans every
//! volume and snapshot made by an earlier version: don't.

use uuid::Uuid;

use crate::backend::Kind;

/// Longest name used as it is; leaves room for `snap-nvmf-` in 62 bytes.
pub const MAX_PLAIN: usize = 52;
/// How much of a name a hashed slug keeps, for people reading ids.
const HASHED_PREFIX: usize = 19;
/// CSI's limit on strings, names included.
const MAX_NAME_BYTES: usize = 128;
/// The namespace of the slug digests (random, never change).
const SLUG_NAMESPACE: Uuid = Uuid::from_u128(0x3e0c_52b1_8a7d_4f6e_9d21_6b5f_0c44_a7e9);
const SNAPSHOT_PREFIX: &str = "snap-";
const GROUP_PREFIX: &str = "group-";
const GROUP_SNAPSHOT_PREFIX: &str = "gsnap-";
/// The namespace of member snapshot digests (random, never change).
const MEMBER_NAMESPACE: Uuid = Uuid::from_u128(0x9b1f_3c6e_02d4_4a8b_b7e5_5d90_6f21_c3a8);

/// A CSI name is 1 to 128 bytes without control characters (the spec bans
/// U+0000-U+0008, U+000B, U+000C, U+000E-U+001F and U+007F-U+009F).
pub fn check_name(field: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{field} is required"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{field} is {} bytes long; CSI allows at most {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    let banned = |c: char| matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}');
    if let Some(c) = name.chars().find(|&c| banned(c)) {
        return Err(format!(
            "{field} {name:?} holds the control character U+{:04X}, which CSI names may not",
            u32::from(c)
        ));
    }
    Ok(())
}

/// The slug of a name that passed [`check_name`].
pub fn slug(name: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'-';
    if name.len() <= MAX_PLAIN && name.bytes().all(plain) {
        return name.to_string();
    }
    let readable: String = name
        .bytes()
        .take(HASHED_PREFIX)
        .map(|b| if plain(b) { char::from(b) } else { '-' })
        .collect();
    let digest = Uuid::new_v5(&SLUG_NAMESPACE, name.as_bytes());
    format!("{readable}_{}", digest.simple())
}

fn is_slug(s: &str) -> bool {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'-';
    if !s.is_empty() && s.len() <= MAX_PLAIN && s.bytes().all(plain) {
        return true;
    }
    match s.split_once('_') {
        Some((readable, hex)) => {
            readable.len() <= HASHED_PREFIX
                && readable.bytes().all(plain)
                && hex.len() == 32
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }
        None => false,
    }
}

/// The id of the volume named `name` on `kind`.
pub fn volume_id(kind: Kind, name: &str) -> String {
    format!("{}-{}", kind.as_str(), slug(name))
}

/// The backend and slug of a volume id we could have issued.
pub fn parse_volume_id(id: &str) -> Option<(Kind, &str)> {
    Kind::ALL.into_iter().find_map(|kind| {
        let slug = id.strip_prefix(kind.as_str())?.strip_prefix('-')?;
        is_slug(slug).then_some((kind, slug))
    })
}

/// The id of the snapshot named `name` on `kind`.
pub fn snapshot_id(kind: Kind, name: &str) -> String {
    format!("{SNAPSHOT_PREFIX}{}", volume_id(kind, name))
}

/// The backend and slug of a snapshot id we could have issued.
pub fn parse_snapshot_id(id: &str) -> Option<(Kind, &str)> {
    parse_volume_id(id.strip_prefix(SNAPSHOT_PREFIX)?)
}

/// The id of the group snapshot named `name` on `kind`.
pub fn group_snapshot_id(kind: Kind, name: &str) -> String {
    format!("{GROUP_SNAPSHOT_PREFIX}{}", volume_id(kind, name))
}

/// The backend and slug of a group snapshot id we could have issued.
pub fn parse_group_snapshot_id(id: &str) -> Option<(Kind, &str)> {
    parse_volume_id(id.strip_prefix(GROUP_SNAPSHOT_PREFIX)?)
}

/// The snapshot id of `volume_id`'s member of the group snapshot named
/// `group_name`: the group's readable prefix, then a digest of both.
pub fn member_snapshot_id(kind: Kind, group_name: &str, volume_id: &str) -> String {
    let readable: String = slug(group_name)
        .bytes()
        .take_while(|&b| b != b'_')
        .take(HASHED_PREFIX)
        .map(char::from)
        .collect();
    let digest = Uuid::new_v5(
        &MEMBER_NAMESPACE,
        format!("{group_name}\0{volume_id}").as_bytes(),
    );
    format!(
        "{SNAPSHOT_PREFIX}{}-{readable}_{}",
        kind.as_str(),
        digest.simple()
    )
}

/// The id of the volume group named `name`.
pub fn group_id(name: &str) -> String {
    format!("{GROUP_PREFIX}{}", slug(name))
}

/// Whether `id` is a volume group id we could have issued.
pub fn is_group_id(id: &str) -> bool {
    id.strip_prefix(GROUP_PREFIX).is_some_and(is_slug)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_names_stay_readable_and_never_change() {
        let name = "pvc-0b9a1e0e-1111-4c7e-9f00-000000000001";
        assert_eq!(volume_id(Kind::Aio, name), format!("aio-{name}"));
        assert_eq!(volume_id(Kind::Nvmf, name), format!("nvmf-{name}"));
        assert_eq!(
            snapshot_id(Kind::Nvmf, "snapshot-1"),
            "snap-nvmf-snapshot-1"
        );
        assert_eq!(group_id("g1"), "group-g1");
        assert_eq!(group_snapshot_id(Kind::Nvmf, "gs1"), "gsnap-nvmf-gs1");
        assert_eq!(
            member_snapshot_id(Kind::Aio, "gs1", "aio-pvc-1"),
            "snap-aio-gs1_d18cf43c22005d00a7d8bd93b53a3fe5"
        );
        // Pinned: volumes made by an earlier build are found only by these.
        assert_eq!(
            volume_id(Kind::Aio, "my volume/1"),
            "aio-my-volume-1_4640a14beced50858a425d6a172ca31e"
        );
    }

    #[test]
    fn every_id_is_short_safe_and_parses_back() {
        let names = [
            "pvc-1",
            "a",
            "under_score",
            "x".repeat(MAX_PLAIN).as_str(),
            "y".repeat(MAX_PLAIN + 1).as_str(),
            "ünïcode ✓ name",
            "a/b/../c",
            "é".repeat(64).as_str(),
        ]
        .map(str::to_string);
        for name in &names {
            check_name("name", name).unwrap();
            for kind in Kind::ALL {
                for id in [volume_id(kind, name), snapshot_id(kind, name)] {
                    assert!(id.len() <= 62, "{id}");
                    assert!(
                        id.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                        "{id}"
                    );
                }
                let id = volume_id(kind, name);
                assert_eq!(parse_volume_id(&id), Some((kind, slug(name).as_str())));
                assert_eq!(parse_snapshot_id(&id), None);
                let snap = snapshot_id(kind, name);
                assert_eq!(parse_snapshot_id(&snap), Some((kind, slug(name).as_str())));
                assert_eq!(parse_volume_id(&snap), None, "{snap}");
            }
            assert!(is_group_id(&group_id(name)));
            for kind in Kind::ALL {
                let group = group_snapshot_id(kind, name);
                assert!(group.len() <= 63, "{group}");
                assert_eq!(
                    parse_group_snapshot_id(&group),
                    Some((kind, slug(name).as_str()))
                );
                assert_eq!(parse_snapshot_id(&group), None);
                let member = member_snapshot_id(kind, name, &volume_id(kind, "pvc-1"));
                assert!(member.len() <= 62, "{member}");
                assert_eq!(parse_snapshot_id(&member).map(|(k, _)| k), Some(kind));
                // No CreateSnapshot name gives a member's id.
                assert_ne!(member, snapshot_id(kind, &member));
                assert_ne!(
                    member,
                    member_snapshot_id(kind, name, &volume_id(kind, "pvc-2"))
                );
            }
        }
    }

    #[test]
    fn hashed_and_plain_slugs_never_meet() {
        let hashed = slug("under_score");
        assert!(hashed.starts_with("under-score_"), "{hashed}");
        // Someone naming a volume after another's slug gets a slug of their own.
        assert_ne!(slug(&hashed), hashed);
        assert_ne!(slug("a b"), slug("a-b"));
        assert_eq!(slug("a-b"), "a-b");
    }

    #[test]
    fn malformed_names_and_foreign_ids_are_refused() {
        assert!(check_name("name", "").unwrap_err().contains("required"));
        assert!(
            check_name("name", &"x".repeat(129))
                .unwrap_err()
                .contains("128")
        );
        assert!(
            check_name("name", "bad\u{1}name")
                .unwrap_err()
                .contains("U+0001")
        );
        assert!(check_name("name", "tab\tand\nnewline").is_ok());
        for foreign in [
            "",
            "pvc-1",
            "aio-",
            "aio-a.b",
            "nvmf-a_b",
            "iscsi-x",
            "snap-aio-",
        ] {
            assert_eq!(parse_volume_id(foreign), None, "{foreign}");
            assert_eq!(parse_snapshot_id(foreign), None, "{foreign}");
        }
        assert!(!is_group_id("group-"));
    }
}
