use std::cell::{Cell, RefCell};

wit_bindgen::generate!({
    world: "changelog",
    path: "../../wit",
    // As the real guest: a block's pieces are borrowed slices, which lets it lie by
    // lending the same bytes many times.
    ownership: Borrowing { duplicate_if_necessary: false },
});

use dstl::changelog::types as w;
use dstl::changelog::{local_registry, registry, uploader};
use exports::dstl::changelog::errors::Guest as ErrorsGuest;
use exports::dstl::changelog::files::{self, Guest as FilesGuest};
use exports::dstl::changelog::reader::{Guest as ReaderGuest, PackedChanges};
use exports::dstl::changelog::writer::{Guest as WriterGuest, GuestWriter};

struct Component;

struct Hostile {
    next_task: Cell<u64>,
    /// The file a `persist` names in its (forged) snapshot, set by `forge`.
    forged: RefCell<Option<String>>,
}

/// One well-formed change-set block: one metadata change of `size` zero bytes.
fn block(size: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + size as usize);
    out.extend_from_slice(&1i32.to_be_bytes()); // groups
    out.extend_from_slice(&1i32.to_be_bytes()); // changes in the group
    out.extend_from_slice(&(-1i32).to_be_bytes()); // key group
    out.extend_from_slice(&(size as i32).to_be_bytes());
    out.resize(out.len() + size as usize, 0);
    out
}

fn handle(path: &str) -> w::StreamHandle {
    w::StreamHandle {
        path: path.to_string(),
        file_size: 0,
    }
}

/// A command this guest cannot run, a bug of the test that sent it: the guest panics, so
/// the writer traps with the message (no writer error carries text).
fn invalid(message: String) -> w::WriterError {
    panic!("hostile guest: {message}")
}

impl Hostile {
    fn run(&self, command: &str) -> Result<(), w::WriterError> {
        let (verb, rest) = command.split_once(' ').unwrap_or((command, ""));
        let number = |text: &str| {
            text.trim()
                .parse::<i64>()
                .map_err(|_| invalid(format!("not a number: {text:?}")))
        };
        // `SIZE COUNT`, the arguments of the aliasing commands.
        let size_and_count = |rest: &str| -> Result<(u64, u64), w::WriterError> {
            let (size, count) = rest
                .split_once(' ')
                .ok_or_else(|| invalid(format!("{verb} needs SIZE COUNT: {rest:?}")))?;
            Ok((number(size)? as u64, number(count)? as u64))
        };
        match verb {
            "release" => registry::release(&handle(rest)),
            "stop-tracking" => registry::stop_tracking(&handle(rest)),
            "register" => {
                let (path, checkpoint) = rest
                    .rsplit_once(' ')
                    .ok_or_else(|| invalid(format!("register needs PATH CHECKPOINT: {rest:?}")))?;
                local_registry::register(&handle(path), number(checkpoint)?);
            }
            "discard" => {
                local_registry::discard_up_to(number(rest)?);
            }
            // A valid block of SIZE payload bytes, described truthfully.
            "schedule" => {
                let size = number(rest)? as u64;
                self.schedule(vec![(0, size, block(size))])?;
            }
            // A valid block of SIZE payload bytes that claims to hold none.
            "schedule-lying" => {
                let size = number(rest)? as u64;
                self.schedule(vec![(0, 0, block(size))])?;
            }
            // SIZE bytes that are no change-set block at all.
            "schedule-garbage" => {
                let size = number(rest)? as u64;
                self.schedule(vec![(0, size, vec![0xff; size as usize])])?;
            }
            "schedule-empty" => self.schedule(Vec::new())?,
            // One block of SIZE bytes lent COUNT times as the pieces of one change set:
            // more bytes than the guest's memory holds.
            "schedule-aliased" => {
                let (size, count) = size_and_count(rest)?;
                let bytes = block(size);
                let pieces = vec![&bytes[..]; count as usize];
                self.schedule_pieces(vec![(0, 0, &pieces[..])])?;
            }
            // One valid block of SIZE payload bytes lent as COUNT change sets of one task.
            "schedule-aliased-blocks" => {
                let (size, count) = size_and_count(rest)?;
                let bytes = block(size);
                let pieces = [&bytes[..]];
                self.schedule_pieces(
                    (0..count)
                        .map(|sequence_number| (sequence_number, size, &pieces[..]))
                        .collect(),
                )?;
            }
            // Two change sets whose sequence numbers descend.
            "schedule-descending" => self.schedule(vec![(5, 1, block(1)), (3, 1, block(1))])?,
            // The next persist returns a snapshot naming PATH, which this writer never wrote.
            "forge" => *self.forged.borrow_mut() = Some(rest.to_string()),
            "spin" => {
                let mut x = 1u64;
                loop {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "grow" => {
                let bytes = vec![1u8; number(rest)? as usize];
                std::hint::black_box(&bytes);
            }
            "panic" => panic!("{rest}"),
            other => return Err(invalid(format!("unknown command {other:?}"))),
        }
        Ok(())
    }

    /// Schedules one task holding `(sequence number, claimed size, block)` change sets,
    /// each block in one piece.
    fn schedule(&self, change_sets: Vec<(u64, u64, Vec<u8>)>) -> Result<(), w::WriterError> {
        let pieces: Vec<[&[u8]; 1]> = change_sets.iter().map(|c| [&c.2[..]]).collect();
        self.schedule_pieces(
            change_sets
                .iter()
                .zip(&pieces)
                .map(|(c, pieces)| (c.0, c.1, &pieces[..]))
                .collect(),
        )
    }

    /// Schedules one task holding `(sequence number, claimed size, pieces)` change sets.
    fn schedule_pieces(
        &self,
        change_sets: Vec<(u64, u64, &[&[u8]])>,
    ) -> Result<(), w::WriterError> {
        let id = self.next_task.get();
        self.next_task.set(id + 1);
        let change_sets: Vec<w::ChangeSetBlock<'_>> = change_sets
            .into_iter()
            .map(|(sequence_number, size, pieces)| w::ChangeSetBlock {
                sequence_number,
                size,
                pieces,
            })
            .collect();
        uploader::schedule(w::UploadTask {
            id,
            change_sets: &change_sets,
            preemptive: false,
        })
        // Lent or not, this guest lets its pieces go at once: the host must not mind.
        .map(drop)
        .map_err(|refusal| {
            w::WriterError::UploadFailed(w::UploadFailure::Refused(w::Refused {
                change_sets: Vec::new(),
                refusal,
            }))
        })
    }
}

impl ErrorsGuest for Component {
    fn describe(error: w::WriterError, _upload: Option<String>) -> String {
        format!("{error:?}")
    }
}

impl GuestWriter for Hostile {
    fn new(_config: w::WriterConfig) -> Self {
        Self {
            next_task: Cell::new(0),
            forged: RefCell::new(None),
        }
    }

    fn append(&self, _key_group: i32, _value: Vec<u8>) -> Result<(), w::WriterError> {
        Ok(())
    }

    fn append_batch(
        &self,
        _key_groups: Vec<i32>,
        _lengths: Vec<u32>,
        data: Vec<u8>,
    ) -> Result<u64, w::WriterError> {
        let command = String::from_utf8(data).map_err(|e| invalid(e.to_string()))?;
        self.run(&command)?;
        Ok(0)
    }

    /// Runs the first change's value as a command, as `append-batch` runs its data.
    fn append_framed(&self, data: Vec<u8>) -> Result<u64, w::WriterError> {
        let command = data
            .get(12..)
            .ok_or_else(|| invalid("a framed batch without a change".into()))?;
        let command = String::from_utf8(command.to_vec()).map_err(|e| invalid(e.to_string()))?;
        self.run(&command)?;
        Ok(0)
    }

    fn append_meta(&self, _value: Vec<u8>) -> Result<(), w::WriterError> {
        Ok(())
    }

    fn initial_sequence_number(&self) -> u64 {
        0
    }

    fn next_sequence_number(&self) -> u64 {
        0
    }

    fn persist(
        &self,
        _key_groups: Vec<i32>,
        _lengths: Vec<u32>,
        _data: Vec<u8>,
        _start: u64,
        _checkpoint: i64,
    ) -> Result<w::PersistReply, w::WriterError> {
        let Some(path) = self.forged.borrow().clone() else {
            return Err(invalid("this component does not persist".into()));
        };
        let handle = |path: &str| w::ChangelogHandle {
            entries: vec![w::HandleEntry {
                handle: w::StreamHandle {
                    path: path.to_string(),
                    file_size: 1,
                },
                offset: 1,
                size: 1,
            }],
            key_group_range: w::KeyGroupRange { start: 0, end: 0 },
            state_size: 1,
            incremental_size: 1,
            storage_id: "forged".to_string(),
        };
        Ok(w::PersistReply::Ready(w::SnapshotResult {
            remote: handle(&path),
            local: None,
        }))
    }

    fn persist_framed(
        &self,
        _data: Vec<u8>,
        start: u64,
        checkpoint: i64,
    ) -> Result<w::PersistReply, w::WriterError> {
        self.persist(Vec::new(), Vec::new(), Vec::new(), start, checkpoint)
    }

    fn truncate(&self, _to: u64) -> Result<(), w::WriterError> {
        Ok(())
    }

    fn truncate_and_close(&self, _start: u64) -> Result<Vec<w::PersistCompletion>, w::WriterError> {
        Ok(Vec::new())
    }

    fn confirm(&self, _start: u64, _end: u64, _checkpoint: i64) -> Result<(), w::WriterError> {
        Ok(())
    }

    fn reset(&self, _start: u64, _end: u64, _checkpoint: i64) -> Result<(), w::WriterError> {
        Ok(())
    }

    fn close(&self) -> Result<Vec<w::PersistCompletion>, w::WriterError> {
        Ok(Vec::new())
    }

    fn on_upload_succeeded(
        &self,
        _task: u64,
        _results: Vec<w::UploadResult>,
        _returned: Vec<u64>,
    ) -> Vec<w::PersistCompletion> {
        Vec::new()
    }

    fn on_upload_failed(&self, _task: u64, _returned: Vec<u64>) -> Vec<w::PersistCompletion> {
        Vec::new()
    }
}

impl WriterGuest for Component {
    type Writer = Hostile;
}

impl ReaderGuest for Component {
    fn decode_change_set(_logical: Vec<u8>, _offset: u64) -> Result<Vec<w::Change>, String> {
        Err("this component does not decode".into())
    }

    fn logical_bytes(_file: Vec<u8>) -> Result<Vec<u8>, String> {
        Err("this component does not decode".into())
    }

    fn read_file(
        _path: String,
        _file: Result<Vec<u8>, String>,
        _logical_size: u64,
        _offsets: Vec<u64>,
    ) -> Result<PackedChanges, String> {
        Err("this component does not decode".into())
    }
}

impl FilesGuest for Component {
    fn encode_file(
        _blocks: Vec<Vec<u8>>,
        _compression: bool,
    ) -> Result<files::EncodedFile, String> {
        Err("this component does not encode".into())
    }

    fn layout_plain_file(_block_sizes: Vec<u64>) -> files::PlainLayout {
        files::PlainLayout {
            header: Vec::new(),
            offsets: Vec::new(),
            logical_size: 0,
        }
    }
}

export!(Component);
