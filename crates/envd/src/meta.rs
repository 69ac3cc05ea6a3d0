//! User metadata of files (envd 0.6.2): `X-Metadata-<key>: <value>` headers of an upload become
//! the file's `user.e2b.<key>` extended attributes, and every `EntryInfo` (stat, list, the upload's
//! answer) reads them back.
//!
//! An upload sets the file's whole metadata, as E2B's envd does: keys it does not send are
//! removed, so a file written again without metadata has none. Truncating a file keeps its
//! extended attributes, so without that rule a rewrite would silently carry the previous
//! writer's metadata. Attributes outside `user.e2b.` (other tools') are never touched.
//!
//! The attribute calls follow symlinks, like the upload that opens the path for writing.

use std::collections::HashMap;
use std::io;
use std::path::Path;

/// The extended-attribute namespace of the metadata.
const PREFIX: &str = "user.e2b.";
/// The header prefix of the metadata (lower case, as `http` names are).
const HEADER_PREFIX: &str = "x-metadata-";
/// The longest key: Linux limits an attribute's whole name to 255 bytes.
pub const MAX_KEY_LEN: usize = 255 - PREFIX.len();
/// The longest value (E2B's limit: a file's attributes share one block of ext4).
pub const MAX_VALUE_LEN: usize = 1024;
/// The most bytes of keys and values in all (one 4 KiB ext4 block holds a file's attributes).
pub const MAX_TOTAL_LEN: usize = 4096;

/// Why a request's metadata was refused (the upload answers 400 with it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetadataError {
    /// A key longer than [`MAX_KEY_LEN`].
    #[error("metadata key '{0}' exceeds {MAX_KEY_LEN} bytes")]
    KeyTooLong(String),
    /// A value longer than [`MAX_VALUE_LEN`].
    #[error("metadata value for key '{0}' exceeds {MAX_VALUE_LEN} bytes")]
    ValueTooLong(String),
    /// A value that is not printable US-ASCII.
    #[error("metadata value for key '{0}' must be printable US-ASCII")]
    NotPrintable(String),
    /// More than [`MAX_TOTAL_LEN`] bytes in all.
    #[error("metadata exceeds {MAX_TOTAL_LEN} bytes")]
    TooLarge,
}

/// The metadata an upload's headers carry, keys lower-cased. A header without a key
/// (`X-Metadata-`) is ignored and a repeated header counts once, with its first value, as in E2B's
/// envd.
pub fn from_headers(headers: &http::HeaderMap) -> Result<HashMap<String, String>, MetadataError> {
    let mut out = HashMap::new();
    let mut total = 0;
    for name in headers.keys() {
        let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) else { continue };
        let Some(value) = headers.get(name) else { continue };
        if key.is_empty() {
            continue;
        }
        let value = check(key, value.as_bytes())?;
        total += key.len() + value.len();
        out.insert(key.to_owned(), value);
    }
    if total > MAX_TOTAL_LEN {
        return Err(MetadataError::TooLarge);
    }
    Ok(out)
}

/// One key and value against E2B's rules; gives the value as text.
fn check(key: &str, value: &[u8]) -> Result<String, MetadataError> {
    if key.len() > MAX_KEY_LEN {
        return Err(MetadataError::KeyTooLong(key.to_owned()));
    }
    if value.len() > MAX_VALUE_LEN {
        return Err(MetadataError::ValueTooLong(key.to_owned()));
    }
    if !value.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Err(MetadataError::NotPrintable(key.to_owned()));
    }
    Ok(String::from_utf8_lossy(value).into_owned())
}

/// Whether `e` says the file system keeps no user extended attributes (then a file has no
/// metadata and an upload's metadata is dropped).
pub fn unsupported(e: &io::Error) -> bool {
    use rustix::io::Errno;
    // `EOPNOTSUPP` is `ENOTSUP` on Linux; special files answer `EPERM` for user attributes.
    matches!(Errno::from_io_error(e), Some(Errno::NOTSUP | Errno::PERM))
}

/// The metadata of `path`, prefix stripped; empty when it has none or cannot have any.
pub fn read(path: &Path) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Ok(names) = e2b_names(path) else { return out };
    for name in names {
        let Ok(value) = get(path, &name) else { continue };
        let key = String::from_utf8_lossy(&name[PREFIX.len()..]).into_owned();
        out.insert(key, String::from_utf8_lossy(&value).into_owned());
    }
    out
}

/// Makes `metadata` the whole metadata of `path`: the `user.e2b.*` attributes it does not name
/// are removed first (so the new ones have the room), then each of its keys is set.
pub fn replace(path: &Path, metadata: &HashMap<String, String>) -> io::Result<()> {
    for name in e2b_names(path)? {
        let key = String::from_utf8_lossy(&name[PREFIX.len()..]);
        if !metadata.contains_key(key.as_ref()) {
            match rustix::fs::removexattr(path, name.as_slice()) {
                Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    for (k, v) in metadata {
        let name = format!("{PREFIX}{k}");
        rustix::fs::setxattr(path, name.as_str(), v.as_bytes(), rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}

/// The full names of the `user.e2b.*` attributes of `path`.
fn e2b_names(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let list = list(path)?;
    Ok(list
        .split(|b| *b == 0)
        .filter(|n| n.len() > PREFIX.len() && n.starts_with(PREFIX.as_bytes()))
        .map(<[u8]>::to_vec)
        .collect())
}

/// `listxattr` into a buffer of the size it needs (asked again if the list grew meanwhile).
fn list(path: &Path) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 1024];
    loop {
        match rustix::fs::listxattr(path, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => {
                buf.resize(rustix::fs::listxattr_query(path)?.max(buf.len() * 2), 0);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `getxattr` of one attribute (values are at most 64 KiB on Linux).
fn get(path: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MAX_VALUE_LEN];
    loop {
        match rustix::fs::getxattr(path, name, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => {
                buf.resize(rustix::fs::getxattr_query(path, name)?.max(buf.len() * 2), 0);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &[u8])]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn headers_give_lower_case_keys_first_values_and_skip_empty_keys() {
        let h = headers(&[
            ("X-Metadata-Owner", b"oka"),
            ("x-metadata-owner", b"second"),
            ("X-Metadata-", b"ignored"),
            ("X-Metadata-Purpose", b"a b"),
            ("X-Access-Token", b"t"),
        ]);
        let m = from_headers(&h).unwrap();
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m["owner"], "oka");
        assert_eq!(m["purpose"], "a b");
        assert!(from_headers(&http::HeaderMap::new()).unwrap().is_empty());
    }

    #[test]
    fn headers_outside_the_rules_are_refused() {
        let long_key = format!("x-metadata-{}", "k".repeat(MAX_KEY_LEN + 1));
        let cases: [(&str, Vec<u8>, MetadataError); 4] = [
            (&long_key, b"v".to_vec(), MetadataError::KeyTooLong("k".repeat(MAX_KEY_LEN + 1))),
            (
                "x-metadata-a",
                vec![b'v'; MAX_VALUE_LEN + 1],
                MetadataError::ValueTooLong("a".into()),
            ),
            ("x-metadata-a", b"tab\there".to_vec(), MetadataError::NotPrintable("a".into())),
            ("x-metadata-a", vec![0xe9], MetadataError::NotPrintable("a".into())),
        ];
        for (k, v, want) in cases {
            assert_eq!(from_headers(&headers(&[(k, &v)])), Err(want), "{k}");
        }
        let max = vec![b'v'; MAX_VALUE_LEN];
        let five: Vec<(String, &[u8])> =
            (0..5).map(|i| (format!("x-metadata-k{i}"), max.as_slice())).collect();
        let five: Vec<(&str, &[u8])> = five.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(from_headers(&headers(&five)), Err(MetadataError::TooLarge));
        assert_eq!(from_headers(&headers(&five[..3])).unwrap().len(), 3);
    }

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn replace_sets_the_whole_metadata_and_leaves_other_attributes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "x").unwrap();
        match replace(&path, &map(&[("author", "mish"), ("purpose", "upload")])) {
            Err(e) if unsupported(&e) => return, // no user attributes here: nothing to test
            r => r.unwrap(),
        }
        rustix::fs::setxattr(&path, "user.other", b"keep", rustix::fs::XattrFlags::empty())
            .unwrap();
        assert_eq!(read(&path), map(&[("author", "mish"), ("purpose", "upload")]));

        replace(&path, &map(&[("author", "alice")])).unwrap();
        assert_eq!(read(&path), map(&[("author", "alice")]));

        replace(&path, &HashMap::new()).unwrap();
        assert!(read(&path).is_empty());
        let mut other = [0u8; 8];
        let n = rustix::fs::getxattr(&path, "user.other", &mut other[..]).unwrap();
        assert_eq!(&other[..n], b"keep");
    }

    #[test]
    fn read_of_a_missing_file_is_empty() {
        assert!(read(Path::new("/no/such/file/oka")).is_empty());
    }
}
