//! Where a request id was last written in its lane's remembered ids, as a
//! client may carry it from one attempt to the next (the way a deferral's
//! answer could hand it a token to send back). With it, a return finds its
//! id with one read of the write it names, checked against the id's key,
//! instead of a look-up in the index of a million ids. A hint that no
//! longer names the id's live write (written again, forgotten, another
//! lane, or made up) is ignored and the id is looked up as without one:
//! a hint changes how fast an id is found, never what is found.

/// A position in a lane's remembered ids (its low 32 bits, as the index
/// keeps them: 4 bytes a client carries), or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdHint(u32);

impl IdHint {
    /// No hint: the id is looked up. (A write whose position ends in these
    /// 32 bits gets no hint: it is looked up, once in 2^32 writes.)
    pub const NONE: IdHint = IdHint(u32::MAX);

    pub(crate) fn at(pos: u64) -> IdHint {
        IdHint(pos as u32)
    }

    /// The low 32 bits of the position it names, if any.
    pub(crate) fn low(self) -> Option<u32> {
        (self != IdHint::NONE).then_some(self.0)
    }
}

impl Default for IdHint {
    fn default() -> Self {
        IdHint::NONE
    }
}
