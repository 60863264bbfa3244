//! ReadValue: a value an event or a session read carries cut
//! ([`crate::bound`]), read whole from the conversation store and streamed
//! in chunks of at most [`crate::bound::VALUE_CHUNK_BYTES`].

use super::OrchestratorService;
use super::guard::Owned;
use crate::bound::{EVENT_FIELDS, VALUE_CHUNK_BYTES, event_field, message_value};
use crate::error::OrchestratorError;
use omicos_proto::{ChatEvent, ReadValueRequest, ValueChunk, value_ref};
use prost::Message;
use std::pin::Pin;
use tokio_stream::Stream;
use tonic::Status;

/// The chunks of one value, the first with its size.
pub(super) type ValueStream = Pin<Box<dyn Stream<Item = Result<ValueChunk, Status>> + Send>>;

/// `text` as it goes into an error message: short, whatever the client sent.
fn quoted(text: &str) -> String {
    format!("`{}`", crate::bound::cut(text, 200, ""))
}

impl OrchestratorService {
    /// ReadValue: the whole value a `cut_values` entry names.
    pub(super) async fn read_value_rpc(
        &self,
        owned: &Owned,
        req: ReadValueRequest,
    ) -> Result<ValueStream, OrchestratorError> {
        let id = owned.id().to_owned();
        let store = self.hub.store();
        let at = req.value.and_then(|v| v.at).ok_or_else(|| {
            OrchestratorError::InvalidArgument(
                "ReadValueRequest.value names no value: pass a cut_values entry of an event \
                 (event: event_seq and field) or of GetSession (message: index and pointer)"
                    .into(),
            )
        })?;
        let whole = match at {
            value_ref::At::Event(e) => {
                if !EVENT_FIELDS.contains(&e.field.as_str()) {
                    return Err(OrchestratorError::InvalidArgument(format!(
                        "no event carries a field {}: one of {}",
                        quoted(&e.field),
                        EVENT_FIELDS.join(", ")
                    )));
                }
                let bytes = store.event_at(&id, e.event_seq).await?.ok_or_else(|| {
                    OrchestratorError::ValueNotFound(format!(
                        "session `{id}` has no event {}",
                        e.event_seq
                    ))
                })?;
                // A damaged record: the store's fault, as Attach logs it.
                let ev = ChatEvent::decode(bytes.as_slice()).map_err(|err| {
                    OrchestratorError::Store(omicos_sessionstore::StoreError::Backend(format!(
                        "stored event {} of session `{id}` does not decode: {err}",
                        e.event_seq
                    )))
                })?;
                event_field(ev, &e.field).ok_or_else(|| {
                    OrchestratorError::ValueNotFound(format!(
                        "event {} of session `{id}` has no {}",
                        e.event_seq, e.field
                    ))
                })?
            }
            value_ref::At::Message(m) => {
                if !m.pointer.is_empty() && !m.pointer.starts_with('/') {
                    return Err(OrchestratorError::InvalidArgument(format!(
                        "pointer {} is not a JSON pointer (RFC 6901): it starts with `/`",
                        quoted(&m.pointer)
                    )));
                }
                let messages = store.messages(&id).await.map_err(|source| match source {
                    omicos_sessionstore::StoreError::NotFound(_) => {
                        OrchestratorError::SessionNotFound(id.clone())
                    }
                    source => OrchestratorError::History {
                        session: id.clone(),
                        source,
                    },
                })?;
                let item = messages.get(m.index as usize).ok_or_else(|| {
                    OrchestratorError::ValueNotFound(format!(
                        "session `{id}` has {} messages: no message {}",
                        messages.len(),
                        m.index
                    ))
                })?;
                message_value(item, &m.pointer).ok_or_else(|| {
                    OrchestratorError::ValueNotFound(format!(
                        "message {} of session `{id}` has no string at {}",
                        m.index,
                        quoted(&m.pointer)
                    ))
                })?
            }
        };
        let size = whole.len() as u64;
        if req.offset > size {
            return Err(OrchestratorError::OffsetPastEnd {
                offset: req.offset,
                size,
            });
        }
        Ok(chunks(whole.into_bytes(), req.offset as usize))
    }
}

/// `whole` from byte `offset` on, in chunks of at most [`VALUE_CHUNK_BYTES`]
/// made as they are sent, the first with the whole value's size; one empty
/// chunk when nothing is left. `offset` is at most `whole.len()`.
fn chunks(whole: Vec<u8>, offset: usize) -> ValueStream {
    let size = whole.len();
    let n = (size - offset).div_ceil(VALUE_CHUNK_BYTES).max(1);
    Box::pin(tokio_stream::iter((0..n).map(move |i| {
        let from = offset + i * VALUE_CHUNK_BYTES;
        let to = (from + VALUE_CHUNK_BYTES).min(size);
        Ok(ValueChunk {
            size_bytes: if i == 0 { size as u64 } else { 0 },
            data: whole[from..to].to_vec(),
        })
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn values_come_in_bounded_chunks_the_first_with_the_size() {
        for size in [
            0,
            1,
            VALUE_CHUNK_BYTES,
            VALUE_CHUNK_BYTES + 1,
            3 * VALUE_CHUNK_BYTES - 7,
        ] {
            let whole: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let got: Vec<ValueChunk> = chunks(whole.clone(), 0).map(Result::unwrap).collect().await;
            assert_eq!(got[0].size_bytes, size as u64);
            assert!(got[1..].iter().all(|c| c.size_bytes == 0));
            assert!(got.iter().all(|c| c.data.len() <= VALUE_CHUNK_BYTES));
            assert_eq!(got.concat_data(), whole, "{size}");
        }
    }

    /// A read resumed at any offset gets exactly the rest, still in bounded
    /// chunks, and the first still says the whole size.
    #[tokio::test]
    async fn a_read_resumes_from_its_offset() {
        let size = 2 * VALUE_CHUNK_BYTES + 5;
        let whole: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        for offset in [
            0,
            1,
            VALUE_CHUNK_BYTES - 1,
            VALUE_CHUNK_BYTES,
            2 * VALUE_CHUNK_BYTES + 4,
            size,
        ] {
            let got: Vec<ValueChunk> = chunks(whole.clone(), offset)
                .map(Result::unwrap)
                .collect()
                .await;
            assert_eq!(got[0].size_bytes, size as u64, "{offset}");
            assert!(got.iter().all(|c| c.data.len() <= VALUE_CHUNK_BYTES));
            assert_eq!(got.concat_data(), whole[offset..], "{offset}");
            assert_eq!(
                got.len(),
                (size - offset).div_ceil(VALUE_CHUNK_BYTES).max(1),
                "{offset}"
            );
        }
    }

    trait Concat {
        fn concat_data(&self) -> Vec<u8>;
    }
    impl Concat for Vec<ValueChunk> {
        fn concat_data(&self) -> Vec<u8> {
            self.iter().flat_map(|c| c.data.iter().copied()).collect()
        }
    }
}
