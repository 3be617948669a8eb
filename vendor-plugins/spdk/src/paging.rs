//! ListDevices paging (and the CSI controller's lists, keyed by id).
//!
//! Devices are listed in name order and a token is the name of the last
//! device of the page before: the next page starts after it. A token is thus
//! a position, not a snapshot kept for the caller. It stays good across
//! plugin restarts and while devices come and go (the API allows the
//! duplicates and misses that follow), so a caller paging through the list
//! (the node does, to find a volume's devices) never fails because the
//! plugin restarted under it. A token that is not such a position, which we
//! cannot have issued, gets ABORTED, as the API demands.

use snap_csi::proto::nvidia::storage::plugins::v1::list_devices_response::Entry;
use tonic::Status;

use crate::names::parse_device_name;

const TOKEN_PREFIX: &str = "after:";

/// Where a page starts: `None` at the beginning, else after the named device.
pub fn parse_token(token: &str) -> Result<Option<&str>, Status> {
    parse_token_of(token, |after| parse_device_name(after).is_some())
}

/// [`parse_token`] for any list whose keys `valid` recognises.
pub fn parse_token_of(token: &str, valid: impl Fn(&str) -> bool) -> Result<Option<&str>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .strip_prefix(TOKEN_PREFIX)
        .filter(|after| valid(after))
        .map(Some)
        .ok_or_else(|| {
            Status::aborted(format!(
                "starting_token {token:?} was not issued by this plugin; start over with an empty token"
            ))
        })
}

/// One page of `entries` (any order) starting after `after`, at most
/// `max_entries` long (0: no limit), and the token of the next page ("" at the end).
pub fn page(entries: Vec<Entry>, after: Option<&str>, max_entries: usize) -> (Vec<Entry>, String) {
    page_by(entries, |e| e.device_name.as_str(), after, max_entries)
}

/// [`page`] for entries of any kind, ordered and positioned by `key`.
pub fn page_by<T>(
    mut entries: Vec<T>,
    key: impl Fn(&T) -> &str,
    after: Option<&str>,
    max_entries: usize,
) -> (Vec<T>, String) {
    entries.sort_by(|a, b| key(a).cmp(key(b)));
    if let Some(after) = after {
        entries.retain(|e| key(e) > after);
    }
    if max_entries == 0 || entries.len() <= max_entries {
        return (entries, String::new());
    }
    entries.truncate(max_entries);
    let next = format!("{TOKEN_PREFIX}{}", key(&entries[max_entries - 1]));
    (entries, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Kind;
    use crate::names::device_name;

    fn entry(volume_id: &str) -> Entry {
        Entry {
            volume_id: volume_id.into(),
            device_name: device_name(Kind::Aio, volume_id),
        }
    }

    #[test]
    fn pages_cover_everything_once_in_name_order() {
        let all = vec![entry("c"), entry("a"), entry("b")];
        let mut seen = vec![];
        let mut token = String::new();
        loop {
            let after = parse_token(&token).unwrap();
            let (entries, next) = page(all.clone(), after, 2);
            assert!(entries.len() <= 2);
            seen.extend(entries.into_iter().map(|e| e.volume_id));
            if next.is_empty() {
                break;
            }
            token = next;
        }
        assert_eq!(seen, ["a", "b", "c"]);
        assert_eq!(page(all.clone(), None, 0).0.len(), 3);
        assert_eq!(
            page(all, None, 3).1,
            "",
            "a full last page has no next token"
        );
    }

    #[test]
    fn a_position_outlives_its_device() {
        let token = format!("{TOKEN_PREFIX}{}", device_name(Kind::Aio, "b"));
        let after = parse_token(&token).unwrap();
        let (entries, next) = page(vec![entry("a"), entry("c")], after, 1);
        assert_eq!(entries[0].volume_id, "c");
        assert_eq!(next, "");
    }

    #[test]
    fn tokens_we_did_not_issue_are_aborted() {
        for bad in [
            "x",
            "after:",
            "after:Malloc0",
            "snapcsi-aio-a",
            "after:snapcsi-aio-a.b",
        ] {
            let status = parse_token(bad).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Aborted, "{bad}");
        }
    }
}
