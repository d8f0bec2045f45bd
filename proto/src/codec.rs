//! The codec of every `clb.v1` client and server: prost's, with small buffers.
//!
//! tonic gives each call an encode buffer and a decode buffer of 8 KiB to start with, kept for as
//! long as the call lives. For a unary call that is brief, but a state server holds a
//! `Writer.WatchSession` stream open for every node agent (thousands), each with its encode buffer
//! for messages of a few dozen bytes: 8 KiB × 5,000 agents is 40 MB of buffers that stay. Here
//! both start at [`BUFFER_SIZE`] and grow as a message needs (a resync chunk or a batch of 1,000
//! updates grows its call's buffer once, as before); the yield threshold stays tonic's.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The initial size of a call's encode and decode buffers.
pub const BUFFER_SIZE: usize = 512;

/// tonic's threshold for yielding encoded bytes to the transport (its default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with buffers of [`BUFFER_SIZE`] to start with (the generated clients and servers
/// use it: `proto/build.rs`).
#[derive(Debug, Clone)]
pub struct LeanCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codec::{Decoder, Encoder};

    /// `BufferSettings` keeps its fields private; its `Debug` shows them.
    fn shown(settings: BufferSettings) -> String {
        format!("{settings:?}")
    }

    #[test]
    fn buffers_start_small_and_keep_tonics_yield_threshold() {
        let mut codec = LeanCodec::<crate::v1::WriterSession, crate::v1::WriterSession>::default();
        let want = shown(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD));
        assert!(want.contains("buffer_size: 512"), "{want}");
        assert_eq!(shown(codec.encoder().buffer_settings()), want);
        assert_eq!(shown(codec.decoder().buffer_settings()), want);
        // The yield threshold is tonic's default.
        let default = shown(BufferSettings::default());
        assert!(default.contains("yield_threshold: 32768"), "{default}");
        assert!(want.contains("yield_threshold: 32768"), "{want}");
    }
}
