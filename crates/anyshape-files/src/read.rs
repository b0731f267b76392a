//! Reading: regular files only, their size checked against a limit before reading.
use crate::{FileError, Result};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// What a non-regular file is, for messages.
fn kind(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

/// Open `path` for reading if it is a regular file (links followed) of at most `limit`
/// bytes, read as `what` (for the message). A FIFO is opened without blocking and
/// refused, so no reader ever waits on one. Returns the file and its size.
pub fn open(path: &Path, limit: u64, what: &str) -> Result<(File, u64)> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading waits for a writer; without blocking it returns
        // at once, and the type check below refuses it.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(FileError::io(path))?;
    let meta = file.metadata().map_err(FileError::io(path))?;
    if !meta.is_file() {
        return Err(FileError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(meta.file_type()),
        });
    }
    #[cfg(unix)]
    // SAFETY: `file` owns a valid descriptor; F_GETFL/F_SETFL only change its flags.
    unsafe {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    if meta.len() > limit {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
            bytes: meta.len(),
            limit,
            what: what.to_string(),
        });
    }
    Ok((file, meta.len()))
}

/// The bytes of the regular file `path`, of at most `limit` bytes (see [`open`]).
pub fn read(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    let (file, len) = open(path, limit, what)?;
    let mut bytes = Vec::with_capacity(len as usize);
    // A file that grows while read is cut at the limit and refused.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(FileError::io(path))?;
    if bytes.len() as u64 > limit {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
            bytes: bytes.len() as u64,
            limit,
            what: what.to_string(),
        });
    }
    Ok(bytes)
}

/// The text of the regular file `path` (UTF-8), of at most `limit` bytes.
pub fn read_to_string(path: &Path, limit: u64, what: &str) -> Result<String> {
    String::from_utf8(read(path, limit, what)?).map_err(|_| FileError::Io {
        path: path.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
    })
}

/// The size of `path` if it is a regular file (links followed), without opening it.
pub fn regular_file_len(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(FileError::io(path))?;
    if !meta.is_file() {
        return Err(FileError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(meta.file_type()),
        });
    }
    Ok(meta.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"12345").unwrap();
        assert_eq!(read(&f, 5, "a test").unwrap(), b"12345");
        let e = read(&f, 4, "a test").unwrap_err().to_string();
        assert!(e.contains("5 bytes") && e.contains("a test"), "{e}");
        let e = read(dir.path(), 10, "x").unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let e = read(Path::new("/dev/zero"), 10, "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("character device"), "{e}");
        #[cfg(unix)]
        {
            let fifo = dir.path().join("fifo");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: a valid path; mkfifo only creates the node.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            // Refused at once, without waiting for a writer.
            let e = read(&fifo, 10, "x").unwrap_err().to_string();
            assert!(e.contains("FIFO"), "{e}");
            assert!(regular_file_len(&fifo).is_err());
        }
        assert!(read(&dir.path().join("none"), 10, "x").is_err());
    }
}
