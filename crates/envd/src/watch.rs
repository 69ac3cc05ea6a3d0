//! Directory watching with inotify: the `WatchDir` stream and the polled
//! `CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher` trio (e2b-protocol.md §3.4).
//!
//! Events are reported like Go's fsnotify (which envd uses): create (also for a moved-in entry),
//! write, remove, rename (for the moved-out name) and chmod; `name` is relative to the watched
//! directory. A recursive watch adds new subdirectories as they appear.

use crate::connect::{Code, ConnectError, Sink};
use crate::proto::{
    Empty, EventType, FilesystemEvent, GetWatcherEventsResponse, WatchDirResponse, WatchRequest,
    WatcherId, watch_dir_response::Event,
};
use crate::rpc::Call;
use crate::state::AppState;
use rustix::fd::OwnedFd;
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// Most events a polled watcher buffers between two `GetWatcherEvents`.
const MAX_BUFFERED: usize = 65_536;

struct Polled {
    events: Arc<Mutex<Vec<FilesystemEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

/// The table of polled watchers.
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, Polled>>,
    next: AtomicU64,
}

impl Drop for Watchers {
    fn drop(&mut self) {
        if let Ok(m) = self.map.lock() {
            for w in m.values() {
                w.task.abort();
            }
        }
    }
}

fn flags() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MODIFY
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE_SELF
        | WatchFlags::ONLYDIR
}

struct Inotify {
    fd: AsyncFd<OwnedFd>,
    dirs: HashMap<i32, PathBuf>, // wd → path relative to the root
    root: PathBuf,
    recursive: bool,
}

impl Inotify {
    /// Watches `rel` (and, when recursive, its subdirectories). With `found`, every entry already
    /// inside is pushed to it: a directory created under a recursive watch may fill up before its
    /// own watch exists, and those entries would otherwise never be reported.
    fn add(&mut self, rel: &Path, mut found: Option<&mut Vec<PathBuf>>) -> std::io::Result<()> {
        let wd = inotify::add_watch(self.fd.get_ref(), self.root.join(rel), flags())?;
        self.dirs.insert(wd, rel.to_path_buf());
        if self.recursive
            && let Ok(rd) = std::fs::read_dir(self.root.join(rel))
        {
            for e in rd.flatten() {
                let child = rel.join(e.file_name());
                if let Some(f) = found.as_deref_mut() {
                    f.push(child.clone());
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = self.add(&child, found.as_deref_mut());
                }
            }
        }
        Ok(())
    }
}

const NETWORK_FS: &[i64] = &[0x6969, 0xFF53_4D42, 0xFE53_4D42, 0x517B, 0x6573_5546, 0x0102_1997];

/// Checks the request and starts watching; events go to `tx` until it closes.
fn spawn_watch(
    state: &AppState,
    call: &Call,
    req: &WatchRequest,
    tx: mpsc::Sender<FilesystemEvent>,
) -> Result<tokio::task::JoinHandle<()>, ConnectError> {
    let user = call.user()?;
    let root = crate::fs::resolve(state, &user, &req.path)?;
    let meta = std::fs::metadata(&root).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            ConnectError::not_found(format!("path '{}' not found", root.display()))
        }
        _ => crate::fs::io_error(&e, &root),
    })?;
    if !meta.is_dir() {
        return Err(ConnectError::invalid(format!("path '{}' is not a directory", root.display())));
    }
    if !req.allow_network_mounts
        && let Ok(st) = rustix::fs::statfs(&root)
        && NETWORK_FS.contains(&{ st.f_type })
    {
        return Err(ConnectError::invalid(format!(
            "path '{}' is on a network mount; set allow_network_mounts to watch it",
            root.display()
        )));
    }
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
        .map_err(|e| ConnectError::internal(format!("inotify: {e}")))?;
    let fd =
        crate::pty::async_fd(fd).map_err(|e| ConnectError::internal(format!("inotify: {e}")))?;
    let mut ino = Inotify { fd, dirs: HashMap::new(), root, recursive: req.recursive };
    ino.add(Path::new(""), None)
        .map_err(|e| ConnectError::internal(format!("inotify watch: {e}")))?;
    let include_entry = req.include_entry;
    let state = state.clone();
    Ok(tokio::spawn(async move {
        if let Err(e) = run(&mut ino, &state, include_entry, &tx).await {
            tracing::debug!(error = %e, "watch ended");
        }
    }))
}

async fn run(
    ino: &mut Inotify,
    state: &AppState,
    include_entry: bool,
    tx: &mpsc::Sender<FilesystemEvent>,
) -> std::io::Result<()> {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 16 * 1024];
    loop {
        let raw: Vec<(i32, ReadFlags, Option<String>)> = tokio::select! {
            g = ino.fd.readable() => {
                let mut g = g?;
                let mut out = Vec::new();
                let mut r = inotify::Reader::new(ino.fd.get_ref(), &mut buf);
                loop {
                    match r.next() {
                        Ok(ev) => out.push((
                            ev.wd(),
                            ev.events(),
                            ev.file_name().map(|n| n.to_string_lossy().into_owned()),
                        )),
                        Err(rustix::io::Errno::AGAIN) => {
                            g.clear_ready();
                            break;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                out
            }
            () = tx.closed() => return Ok(()),
        };
        let mut found = Vec::new();
        for (wd, fl, name) in raw {
            if fl.contains(ReadFlags::IGNORED) {
                ino.dirs.remove(&wd);
                continue;
            }
            let Some(dir) = ino.dirs.get(&wd).cloned() else { continue };
            let rel = match &name {
                Some(n) if !n.is_empty() => dir.join(n),
                _ => dir.clone(),
            };
            if rel.as_os_str().is_empty() {
                continue; // the root itself (DELETE_SELF of the root)
            }
            let ty = if fl.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                if ino.recursive && fl.contains(ReadFlags::ISDIR) {
                    let _ = ino.add(&rel, Some(&mut found));
                }
                EventType::Create
            } else if fl.contains(ReadFlags::MODIFY) {
                EventType::Write
            } else if fl.intersects(ReadFlags::DELETE | ReadFlags::DELETE_SELF) {
                if fl.contains(ReadFlags::DELETE_SELF) && !ino.recursive {
                    continue;
                }
                if fl.contains(ReadFlags::DELETE_SELF) {
                    continue; // reported by the parent's DELETE
                }
                EventType::Remove
            } else if fl.contains(ReadFlags::MOVED_FROM) {
                EventType::Rename
            } else if fl.contains(ReadFlags::ATTRIB) {
                EventType::Chmod
            } else {
                continue;
            };
            let entry = (include_entry
                && matches!(ty, EventType::Create | EventType::Write | EventType::Chmod))
            .then(|| crate::fs::entry_info(state, &ino.root.join(&rel)).ok())
            .flatten();
            let ev = FilesystemEvent {
                name: rel.to_string_lossy().into_owned(),
                r#type: ty as i32,
                entry,
            };
            if tx.send(ev).await.is_err() {
                return Ok(());
            }
            // Entries that were already inside a directory when its watch was added.
            for rel in found.drain(..) {
                let entry = include_entry
                    .then(|| crate::fs::entry_info(state, &ino.root.join(&rel)).ok())
                    .flatten();
                let ev = FilesystemEvent {
                    name: rel.to_string_lossy().into_owned(),
                    r#type: EventType::Create as i32,
                    entry,
                };
                if tx.send(ev).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// `WatchDir` (server stream): `start`, then events and keepalives.
pub async fn watch_dir(
    call: Call,
    req: WatchRequest,
    sink: Sink<WatchDirResponse>,
) -> Result<(), ConnectError> {
    let (tx, mut rx) = mpsc::channel(256);
    let task = spawn_watch(&call.state.clone(), &call, &req, tx)?;
    let _abort = AbortOnDrop(task);
    let gone = |_| ConnectError::new(Code::Canceled, "client disconnected");
    sink.send(&WatchDirResponse { event: Some(Event::Start(Empty {})) }).await.map_err(gone)?;
    loop {
        let next = tokio::select! {
            n = tokio::time::timeout(call.meta.keepalive, rx.recv()) => n,
            () = sink.closed() => return Ok(()),
        };
        let msg = match next {
            Err(_idle) => WatchDirResponse { event: Some(Event::Keepalive(Empty {})) },
            Ok(Some(ev)) => WatchDirResponse { event: Some(Event::Filesystem(ev)) },
            Ok(None) => return Err(ConnectError::internal("the watch ended")),
        };
        sink.send(&msg).await.map_err(gone)?;
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `CreateWatcher`
pub async fn create_watcher(call: Call, req: WatchRequest) -> Result<WatcherId, ConnectError> {
    let (tx, mut rx) = mpsc::channel::<FilesystemEvent>(256);
    let watch = spawn_watch(&call.state.clone(), &call, &req, tx)?;
    let events = Arc::new(Mutex::new(Vec::new()));
    let buf = events.clone();
    let task = tokio::spawn(async move {
        let _watch = AbortOnDrop(watch);
        while let Some(ev) = rx.recv().await {
            if let Ok(mut b) = buf.lock()
                && b.len() < MAX_BUFFERED
            {
                b.push(ev);
            }
        }
    });
    let n = call.state.watchers().next.fetch_add(1, Ordering::Relaxed) + 1;
    let id = format!("w{n}");
    if let Ok(mut m) = call.state.watchers().map.lock() {
        m.insert(id.clone(), Polled { events, task });
    }
    Ok(WatcherId { watcher_id: id })
}

/// `GetWatcherEvents`
pub async fn get_watcher_events(
    call: Call,
    req: WatcherId,
) -> Result<GetWatcherEventsResponse, ConnectError> {
    let m = call
        .state
        .watchers()
        .map
        .lock()
        .map_err(|_| ConnectError::internal("watchers poisoned"))?;
    let w = m.get(&req.watcher_id).ok_or_else(|| {
        ConnectError::not_found(format!("watcher '{}' not found", req.watcher_id))
    })?;
    let events = w.events.lock().map(|mut e| std::mem::take(&mut *e)).unwrap_or_default();
    Ok(GetWatcherEventsResponse { events })
}

/// `RemoveWatcher`
pub async fn remove_watcher(call: Call, req: WatcherId) -> Result<Empty, ConnectError> {
    let removed = call.state.watchers().map.lock().ok().and_then(|mut m| m.remove(&req.watcher_id));
    match removed {
        Some(w) => {
            w.task.abort();
            Ok(Empty {})
        }
        None => Err(ConnectError::not_found(format!("watcher '{}' not found", req.watcher_id))),
    }
}
