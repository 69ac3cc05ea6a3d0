//! What the manager keeps of template builds on disk, so status, logs and tags outlive an
//! `oka serve` restart. Layout under the builds' directory ([`crate::TemplateBuildConfig::dir`]):
//!
//! ```text
//! uploads/<namespace>/<filesHash>                   a COPY step's archive, as uploaded
//! uploads/<namespace>/.<filesHash>.<uuid>.partial   an upload being written (renamed when whole)
//! builds/<namespace>/<template>/<buildID>.json      the build's record (BuildRecord)
//! builds/<namespace>/<template>/<buildID>.log       its log entries, one JSON object a line
//! builds/<namespace>/<template>/tags.json           the template's tags (tag → build)
//! ```
//!
//! A template keeps its [`KEPT_BUILDS`] newest finished builds and every tagged one; older
//! records and logs are removed when a build finishes. Uploads stay (shared by content).
//!
//! Every path segment is checked before use (Kubernetes names, UUIDs, hex hashes), so no
//! request can reach outside the directory. JSON files are written whole to a temporary file
//! and renamed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::templatebuild::LogEntry;

/// A build's state, as E2B's `TemplateBuildStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BuildStatus {
    /// Requested (`POST /v3/templates`), not started yet.
    Waiting,
    /// Running.
    Building,
    /// Succeeded: its template serves.
    Ready,
    /// Failed, or interrupted.
    Error,
}

/// Why a build failed (E2B's `BuildStatusReason` without its entries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    /// What the user reads.
    pub message: String,
    /// The step to blame: the SDK's index, `base` or `finalize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// One build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildRecord {
    /// Its ID (a UUID).
    pub build_id: String,
    /// Its template's name.
    pub template_id: String,
    /// The team's namespace.
    pub namespace: String,
    /// Its state.
    pub status: BuildStatus,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// When it was requested.
    pub created_at: Timestamp,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// `cpuCount` of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u32>,
    /// `memoryMB` of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// The tags it gets when it succeeds.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The image it made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Where a tag points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TagRecord {
    /// The build.
    pub build_id: String,
    /// When the tag was assigned.
    pub created_at: Timestamp,
}

/// A template's tags.
pub type Tags = BTreeMap<String, TagRecord>;

/// The message of a build that was running when its process stopped.
pub const INTERRUPTED: &str = "the build was interrupted: the oka process running it stopped \
     (a restart?) before it finished; build the template again";

/// How many finished builds of a template are kept besides the tagged ones.
pub const KEPT_BUILDS: usize = 20;

/// The finished builds of one template to forget: all but the `keep` newest, never a tagged
/// one (`tagged`: build IDs tags point to) nor one still waiting or running.
pub fn builds_to_forget<'a>(
    builds: impl IntoIterator<Item = &'a BuildRecord>,
    tagged: &std::collections::HashSet<&str>,
    keep: usize,
) -> Vec<&'a BuildRecord> {
    let mut finished: Vec<&BuildRecord> = builds
        .into_iter()
        .filter(|r| matches!(r.status, BuildStatus::Ready | BuildStatus::Error))
        .collect();
    finished
        .sort_by(|a, b| b.finished_at.cmp(&a.finished_at).then(b.created_at.cmp(&a.created_at)));
    finished.into_iter().skip(keep).filter(|r| !tagged.contains(r.build_id.as_str())).collect()
}

/// The paths of the builds' directory.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// The layout under `root`.
    pub fn new(root: &Path) -> Self {
        Self { root: root.to_owned() }
    }

    /// The uploads of a namespace.
    pub fn uploads(&self, namespace: &str) -> PathBuf {
        self.root.join("uploads").join(namespace)
    }

    /// An uploaded archive.
    pub fn upload(&self, namespace: &str, hash: &str) -> PathBuf {
        self.uploads(namespace).join(hash)
    }

    /// A template's directory.
    pub fn template(&self, namespace: &str, template: &str) -> PathBuf {
        self.root.join("builds").join(namespace).join(template)
    }

    /// A build's record.
    pub fn record(&self, record: &BuildRecord) -> PathBuf {
        self.template(&record.namespace, &record.template_id)
            .join(format!("{}.json", record.build_id))
    }

    /// A build's log.
    pub fn log(&self, record: &BuildRecord) -> PathBuf {
        self.template(&record.namespace, &record.template_id)
            .join(format!("{}.log", record.build_id))
    }

    /// A template's tags.
    pub fn tags(&self, namespace: &str, template: &str) -> PathBuf {
        self.template(namespace, template).join("tags.json")
    }

    /// Every build record on disk; unreadable files are logged and skipped.
    pub fn load_records(&self) -> std::io::Result<Vec<BuildRecord>> {
        let mut records = Vec::new();
        let builds = self.root.join("builds");
        for namespace in read_dir_or_empty(&builds)? {
            for template in read_dir_or_empty(&namespace)? {
                for file in read_dir_or_empty(&template)? {
                    let is_record = file.extension().is_some_and(|e| e == "json")
                        && file.file_name().is_some_and(|n| n != "tags.json");
                    if !is_record {
                        continue;
                    }
                    match std::fs::read(&file).map_err(|e| e.to_string()).and_then(|bytes| {
                        serde_json::from_slice::<BuildRecord>(&bytes).map_err(|e| e.to_string())
                    }) {
                        Ok(record) => records.push(record),
                        Err(error) => tracing::warn!(
                            path = %file.display(),
                            %error,
                            "skipping an unreadable template build record"
                        ),
                    }
                }
            }
        }
        Ok(records)
    }

    /// A template's tags from disk (none when there is no file).
    pub fn load_tags(&self, namespace: &str, template: &str) -> std::io::Result<Tags> {
        match std::fs::read(self.tags(namespace, template)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Tags::new()),
            Err(e) => Err(e),
        }
    }
}

fn read_dir_or_empty(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.map(|e| e.path())).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The entries of a log file; a torn last line (a crash mid-write) is dropped.
pub fn read_log(path: &Path) -> std::io::Result<Vec<LogEntry>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect())
}

/// Opens a log file for appending, creating it and its directory.
pub fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

/// Writes `value` as JSON to `path` whole: a temporary file beside it, synced, then a rename.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = parent.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let written = std::fs::File::create(&temporary).and_then(|mut file| {
        std::io::Write::write_all(&mut file, &bytes)?;
        file.sync_all()
    });
    written.and_then(|()| std::fs::rename(&temporary, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn old_untagged_finished_builds_are_forgotten() {
        let record = |id: &str, status, finished: i64| BuildRecord {
            build_id: id.into(),
            template_id: "t".into(),
            namespace: "ns".into(),
            status,
            reason: None,
            created_at: Timestamp::UNIX_EPOCH,
            started_at: None,
            finished_at: Some(Timestamp::from_second(finished).unwrap()),
            cpu_count: None,
            memory_mb: None,
            tags: vec![],
            image: None,
        };
        let all = [
            record("newest", BuildStatus::Ready, 40),
            record("tagged-old", BuildStatus::Ready, 10),
            record("old-error", BuildStatus::Error, 20),
            record("second", BuildStatus::Error, 30),
            record("running", BuildStatus::Building, 0),
        ];
        let tagged = std::collections::HashSet::from(["tagged-old"]);
        let forgotten: Vec<_> =
            builds_to_forget(&all, &tagged, 2).iter().map(|r| r.build_id.as_str()).collect();
        assert_eq!(forgotten, ["old-error"]);
    }

    #[test]
    fn records_round_trip_and_a_torn_log_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        let record = BuildRecord {
            build_id: "b".into(),
            template_id: "t".into(),
            namespace: "ns".into(),
            status: BuildStatus::Building,
            reason: None,
            created_at: Timestamp::UNIX_EPOCH,
            started_at: None,
            finished_at: None,
            cpu_count: Some(1),
            memory_mb: None,
            tags: vec!["default".into()],
            image: None,
        };
        write_json(&layout.record(&record), &record).unwrap();
        write_json(&layout.tags("ns", "t"), &Tags::new()).unwrap();
        assert_eq!(layout.load_records().unwrap(), std::slice::from_ref(&record));
        let log = layout.log(&record);
        std::fs::write(
            &log,
            "{\"timestamp\":\"2026-01-01T00:00:00Z\",\"level\":\"info\",\"message\":\"a\"}\n{\"tim",
        )
        .unwrap();
        let entries = read_log(&log).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].message, "a");
    }
}
