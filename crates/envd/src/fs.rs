//! `filesystem.Filesystem` unary methods (e2b-protocol.md §3.4) and the shared `EntryInfo` builder.

use crate::connect::{Code, ConnectError};
use crate::proto::{
    Empty, EntryInfo, EntryResponse, FileType, ListDirRequest, ListDirResponse, MoveRequest,
    PathRequest, Timestamp,
};
use crate::rpc::Call;
use crate::state::AppState;
use crate::users::{self, User};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

/// Maps an IO error on `path` to the Connect code envd uses.
pub fn io_error(e: &io::Error, path: &Path) -> ConnectError {
    let p = path.display();
    match e.kind() {
        io::ErrorKind::NotFound => ConnectError::not_found(format!("path '{p}' does not exist")),
        io::ErrorKind::PermissionDenied => {
            ConnectError::new(Code::PermissionDenied, format!("permission denied: {p}"))
        }
        io::ErrorKind::NotADirectory => {
            ConnectError::invalid(format!("path '{p}' is not a directory"))
        }
        io::ErrorKind::AlreadyExists => {
            ConnectError::new(Code::AlreadyExists, format!("path '{p}' already exists"))
        }
        io::ErrorKind::StorageFull => {
            ConnectError::new(Code::ResourceExhausted, format!("no space left: {p}"))
        }
        _ if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => ConnectError::new(
            Code::FailedPrecondition,
            format!("cyclic symlink or too many links: {p}"),
        ),
        _ => ConnectError::internal(format!("{p}: {e}")),
    }
}

/// Resolves a request path for `user`.
pub fn resolve(state: &AppState, user: &User, path: &str) -> Result<PathBuf, ConnectError> {
    let init = state.init();
    users::resolve_path(path, user, init.default_workdir.as_deref())
        .map_err(|e| ConnectError::invalid(e.to_string()))
}

/// Go's `FileMode.String()` of `meta` (e.g. `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`).
pub fn mode_string(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::FileTypeExt as _;
    let ft = meta.file_type();
    let mode = meta.mode();
    let mut s = String::new();
    if ft.is_dir() {
        s.push('d');
    }
    if ft.is_symlink() {
        s.push('L');
    }
    if ft.is_block_device() || ft.is_char_device() {
        s.push('D');
    }
    if ft.is_fifo() {
        s.push('p');
    }
    if ft.is_socket() {
        s.push('S');
    }
    if mode & 0o4000 != 0 {
        s.push('u');
    }
    if mode & 0o2000 != 0 {
        s.push('g');
    }
    if ft.is_char_device() {
        s.push('c');
    }
    if mode & 0o1000 != 0 {
        s.push('t');
    }
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// The `EntryInfo` of `path` (absolute), following a final symlink for type, size and mode.
pub fn entry_info(state: &AppState, path: &Path) -> io::Result<EntryInfo> {
    let lmeta = std::fs::symlink_metadata(path)?;
    let is_symlink = lmeta.file_type().is_symlink();
    let target_meta = if is_symlink { std::fs::metadata(path).ok() } else { Some(lmeta.clone()) };
    let r#type = match &target_meta {
        Some(m) if m.is_dir() => FileType::Directory,
        Some(_) => FileType::File,
        None => FileType::Symlink,
    };
    let shown = target_meta.as_ref().unwrap_or(&lmeta);
    let symlink_target = is_symlink.then(|| {
        std::fs::canonicalize(path)
            .or_else(|_| std::fs::read_link(path))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    Ok(EntryInfo {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        r#type: r#type as i32,
        path: path.to_string_lossy().into_owned(),
        size: i64::try_from(shown.len()).unwrap_or(i64::MAX),
        mode: shown.mode() & 0o777,
        permissions: mode_string(&lmeta),
        owner: users::name_of(&state.config().passwd, lmeta.uid()),
        group: users::name_of(&state.config().group, lmeta.gid()),
        modified_time: Some(Timestamp {
            seconds: lmeta.mtime(),
            nanos: i32::try_from(lmeta.mtime_nsec()).unwrap_or(0),
        }),
        symlink_target,
        metadata: crate::meta::read(path),
        is_symlink,
    })
}

/// `mkdir -p` whose new directories are `0755` and owned by `user`.
pub fn make_dirs_owned(path: &Path, user: &User) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = path;
    loop {
        match std::fs::symlink_metadata(cur) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(cur.to_path_buf());
                match cur.parent() {
                    Some(p) => cur = p,
                    None => break,
                }
            }
            Err(e) => return Err(e),
        }
    }
    for dir in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => chown(dir, user),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Gives `path` to `user` (best effort: only root can, and only that matters).
pub fn chown(path: &Path, user: &User) {
    if rustix::process::geteuid().is_root()
        && let Err(e) = std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid))
    {
        tracing::debug!(path = %path.display(), error = %e, "chown failed");
    }
}

/// `Stat`
pub async fn stat(call: Call, req: PathRequest) -> Result<EntryResponse, ConnectError> {
    let user = call.user()?;
    let path = resolve(&call.state, &user, &req.path)?;
    match entry_info(&call.state, &path) {
        Ok(e) => Ok(EntryResponse { entry: Some(e) }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(ConnectError::not_found(format!("file not found: {}", path.display())))
        }
        Err(e) => Err(io_error(&e, &path)),
    }
}

/// `MakeDir`
pub async fn make_dir(call: Call, req: PathRequest) -> Result<EntryResponse, ConnectError> {
    let user = call.user()?;
    let path = resolve(&call.state, &user, &req.path)?;
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("directory '{}' already exists", path.display()),
            ));
        }
        Ok(_) => {
            return Err(ConnectError::invalid(format!(
                "path '{}' already exists but is not a directory",
                path.display()
            )));
        }
        Err(_) => {}
    }
    make_dirs_owned(&path, &user).map_err(|e| io_error(&e, &path))?;
    let entry = entry_info(&call.state, &path).map_err(|e| io_error(&e, &path))?;
    Ok(EntryResponse { entry: Some(entry) })
}

/// `Move`
pub async fn move_entry(call: Call, req: MoveRequest) -> Result<EntryResponse, ConnectError> {
    let user = call.user()?;
    let src = resolve(&call.state, &user, &req.source)?;
    let dst = resolve(&call.state, &user, &req.destination)?;
    if std::fs::symlink_metadata(&src).is_err() {
        return Err(ConnectError::not_found(format!("source '{}' does not exist", src.display())));
    }
    if let Some(parent) = dst.parent() {
        make_dirs_owned(parent, &user).map_err(|e| io_error(&e, parent))?;
    }
    std::fs::rename(&src, &dst).map_err(|e| io_error(&e, &src))?;
    let entry = entry_info(&call.state, &dst).map_err(|e| io_error(&e, &dst))?;
    Ok(EntryResponse { entry: Some(entry) })
}

/// `ListDir`
pub async fn list_dir(call: Call, req: ListDirRequest) -> Result<ListDirResponse, ConnectError> {
    let user = call.user()?;
    let path = resolve(&call.state, &user, &req.path)?;
    let meta = std::fs::metadata(&path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            ConnectError::not_found(format!("directory '{}' does not exist", path.display()))
        }
        _ => io_error(&e, &path),
    })?;
    if !meta.is_dir() {
        return Err(ConnectError::invalid(format!("path '{}' is not a directory", path.display())));
    }
    let depth = req.depth.max(1);
    let mut entries = Vec::new();
    walk(&call.state, &path, 1, depth, &mut entries).map_err(|e| io_error(&e, &path))?;
    Ok(ListDirResponse { entries })
}

fn walk(
    state: &AppState,
    dir: &Path,
    level: u32,
    depth: u32,
    out: &mut Vec<EntryInfo>,
) -> io::Result<()> {
    let mut names: Vec<_> =
        std::fs::read_dir(dir)?.filter_map(Result::ok).map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let p = dir.join(&name);
        let Ok(info) = entry_info(state, &p) else { continue };
        let recurse =
            level < depth && !info.is_symlink && info.r#type == FileType::Directory as i32;
        out.push(info);
        if recurse {
            // Unreadable subdirectories are listed but not descended into.
            let _ = walk(state, &p, level + 1, depth, out);
        }
    }
    Ok(())
}

/// `Remove`
pub async fn remove(call: Call, req: PathRequest) -> Result<Empty, ConnectError> {
    let user = call.user()?;
    let path = resolve(&call.state, &user, &req.path)?;
    if path == Path::new("/") {
        return Err(ConnectError::invalid("refusing to remove '/'"));
    }
    let r = match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
        Ok(_) => std::fs::remove_file(&path),
    };
    r.map_err(|e| io_error(&e, &path))?;
    Ok(Empty {})
}
