use std::cell::Cell;

wit_bindgen::generate!({
    world: "changelog",
    path: "../../wit",
});

use dstl::changelog::types as w;
use dstl::changelog::{local_registry, registry, uploader};
use exports::dstl::changelog::files::{self, Guest as FilesGuest};
use exports::dstl::changelog::reader::Guest as ReaderGuest;
use exports::dstl::changelog::writer::{Guest as WriterGuest, GuestWriter};

struct Component;

struct Hostile {
    next_task: Cell<u64>,
}

fn handle(path: &str) -> w::StreamHandle {
    w::StreamHandle {
        path: path.to_string(),
        file_size: 0,
    }
}

fn invalid(message: String) -> w::WriterError {
    w::WriterError::InvalidArgument(message)
}

impl Hostile {
    fn run(&self, command: &str) -> Result<(), w::WriterError> {
        let (verb, rest) = command.split_once(' ').unwrap_or((command, ""));
        let number = |text: &str| {
            text.trim()
                .parse::<i64>()
                .map_err(|_| invalid(format!("not a number: {text:?}")))
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
            "schedule" => {
                let size = number(rest)? as u64;
                let id = self.next_task.get();
                self.next_task.set(id + 1);
                uploader::schedule(&w::UploadTask {
                    id,
                    change_sets: vec![w::ChangeSetBlock {
                        sequence_number: id,
                        size,
                        block: vec![0; size as usize],
                    }],
                })
                .map_err(w::WriterError::UploadFailed)?;
            }
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
}

impl GuestWriter for Hostile {
    fn new(_config: w::WriterConfig) -> Self {
        Self {
            next_task: Cell::new(0),
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

    fn append_meta(&self, _value: Vec<u8>) -> Result<(), w::WriterError> {
        Ok(())
    }

    fn initial_sequence_number(&self) -> u64 {
        0
    }

    fn next_sequence_number(&self) -> u64 {
        0
    }

    fn persist(&self, _start: u64, _checkpoint: i64) -> Result<w::PersistReply, w::WriterError> {
        Err(invalid("this component does not persist".into()))
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
    ) -> Vec<w::PersistCompletion> {
        Vec::new()
    }

    fn on_upload_failed(&self, _task: u64, _cause: String) -> Vec<w::PersistCompletion> {
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
