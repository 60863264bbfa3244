//! The gRPC codec of every omicos service: prost, except that a message that
//! does not decode (invalid UTF-8 in a string field, a truncated field) is the
//! caller's fault and answers INVALID_ARGUMENT, not INTERNAL.

use prost::Message;
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] with decode failures mapped to INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::default()))
    }
}

/// Decodes with prost; a malformed message is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct StrictDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            Status::invalid_argument(format!(
                "the message does not decode ({}); string fields must be valid UTF-8",
                s.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
