//! The I/O thread: every entry file is written and read here, fed by a bounded queue.

use super::*;

pub(super) fn entry_path(dir: &Path, (kind, hash): Key) -> PathBuf {
    dir.join(format!("{hash:016x}.{}", kind.ext()))
}

pub(super) fn io_thread(dir: PathBuf, jobs: Receiver<Job>, done: Sender<Done>, fail_writes: bool) {
    let mut batch: Vec<Job> = Vec::new();
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while let Ok(j) = jobs.try_recv() {
            batch.push(j);
        }
        // Reads first: a request waits on them. Reads only target entries whose write
        // is done, so they never overtake their own entry's write.
        let (reads, others): (Vec<Job>, Vec<Job>) =
            batch.drain(..).partition(|j| matches!(j, Job::Read { .. }));
        for job in reads.into_iter().chain(others) {
            match job {
                Job::Read { load, slot, header } => {
                    let t = Instant::now();
                    let result = read_entry(&entry_path(&dir, header.key()), &header);
                    let secs = t.elapsed().as_secs_f64();
                    if done
                        .send(Done::Read {
                            load,
                            slot,
                            result,
                            secs,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                Job::Write { gen, header, data } => {
                    let t = Instant::now();
                    let path = entry_path(&dir, header.key());
                    let result = if fail_writes {
                        Err("injected write failure (no space left on device)".to_string())
                    } else {
                        write_entry(&path, &header, &data)
                    };
                    if result.is_err() {
                        let _ = fs::remove_file(&path);
                    }
                    let secs = t.elapsed().as_secs_f64();
                    if done
                        .send(Done::Written {
                            key: header.key(),
                            gen,
                            result,
                            secs,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                Job::Delete { key } => {
                    let _ = fs::remove_file(entry_path(&dir, key));
                }
                Job::Flush(reply) => {
                    let _ = reply.send(());
                }
            }
        }
    }
}

pub(super) fn write_entry(path: &Path, header: &Header, data: &[u8]) -> Result<u64, String> {
    let head = header.bytes();
    let sum = checksum(checksum(0, &head), data);
    files::write_private(path, &[&head, &sum.to_le_bytes(), data], false)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((head.len() + 8 + data.len()) as u64)
}

pub(super) fn read_entry(path: &Path, want: &Header) -> Result<Vec<u8>, String> {
    let head = want.bytes();
    let mut f = files::open_read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut got = vec![0u8; head.len() + 8];
    f.read_exact(&mut got)
        .map_err(|e| format!("{}: header: {e}", path.display()))?;
    if got[..head.len()] != head[..] {
        return Err(format!(
            "{}: header does not match (foreign or stale file)",
            path.display()
        ));
    }
    let sum = u64::from_le_bytes(got[head.len()..].try_into().expect("8 bytes"));
    let mut data = vec![0u8; want.payload_len as usize];
    f.read_exact(&mut data)
        .map_err(|e| format!("{}: payload: {e}", path.display()))?;
    let mut extra = [0u8; 1];
    if f.read(&mut extra).map_err(|e| e.to_string())? != 0 {
        return Err(format!("{}: trailing bytes", path.display()));
    }
    if checksum(checksum(0, &head), &data) != sum {
        return Err(format!("{}: checksum mismatch", path.display()));
    }
    Ok(data)
}
