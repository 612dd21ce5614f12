//! The tier's files are private and its own: directories 0700, files 0600
//! (they hold prompt token ids), written to a fresh temporary name and renamed
//! into place (never through a symlink planted at the name, never truncating a
//! file another process reads), read without following symlinks, and each tier
//! directory locked, so two servers cannot share one (a `--kv-persist` start
//! would delete the other's pages) and the directories of killed processes can
//! be told from live ones and swept.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The lock file in every tier directory.
const LOCK_FILE: &str = ".lock";

/// Prefix of the per-process directories of non-persistent tiers.
pub(super) const TMP_PREFIX: &str = "tmp-";

/// Creates `dir` (and missing parents) readable by the owner only, and makes
/// an existing `dir` so; refuses a symlink.
pub(super) fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)?;
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory (a symlink?)",
            dir.display()
        )));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

fn no_follow(o: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW).mode(0o600);
    }
    o
}

/// Opens `path` for reading, failing on a symlink.
pub(super) fn open_read(path: &Path) -> io::Result<File> {
    no_follow(OpenOptions::new().read(true)).open(path)
}

/// Reads all of `path`, failing on a symlink.
pub(super) fn read_all(path: &Path) -> io::Result<Vec<u8>> {
    let mut b = Vec::new();
    open_read(path)?.read_to_end(&mut b)?;
    Ok(b)
}

/// Writes `parts` to `path`: into a new 0600 file beside it (created
/// exclusively: a planted file or symlink there is removed, never followed),
/// then renamed over `path` (which replaces a symlink, never writes through
/// it). `sync`: flushed to disk before the rename.
pub(super) fn write_private(path: &Path, parts: &[&[u8]], sync: bool) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".part");
    let tmp = PathBuf::from(tmp);
    // A leftover of a crash (or anything planted there): unlinking does not follow.
    let _ = fs::remove_file(&tmp);
    let write = || -> io::Result<()> {
        let mut f = no_follow(OpenOptions::new().write(true).create_new(true)).open(&tmp)?;
        for p in parts {
            f.write_all(p)?;
        }
        if sync {
            f.sync_all()?;
        }
        fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// An exclusive lock on a tier directory, held while the tier is open.
#[derive(Debug)]
pub(super) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir`; fails when another live process holds it.
    pub(super) fn acquire(dir: &Path) -> io::Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let file = no_follow(OpenOptions::new().read(true).write(true).create(true)).open(&path)?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: file }),
            Err(fs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "the KV SSD directory {} is in use by another Tempo9 process; \
                     give each server its own --kv-dir",
                    dir.display()
                ),
            )),
            Err(fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// Removes the per-process tier directories under `base` whose process is
/// gone (their lock is free): what a killed server left behind. Returns how
/// many were removed.
pub(super) fn sweep_stale(base: &Path) -> usize {
    let Ok(rd) = fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let is_tmp = name.to_str().is_some_and(|n| n.starts_with(TMP_PREFIX));
        if !is_tmp || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = e.path();
        // Taking the lock proves its owner dead; it is held while removing.
        if let Ok(_lock) = DirLock::acquire(&dir) {
            if fs::remove_dir_all(&dir).is_ok() {
                tracing::info!(dir = %dir.display(), "KV SSD tier: removed the directory of a stopped process");
                removed += 1;
            }
        }
    }
    removed
}
