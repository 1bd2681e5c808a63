//! Begin/end forms of the round and verify-part guards, for code that awaits between them.
//!
//! A guard borrows its [`Recorder`], which is `Send` but not `Sync`, so a future holding a
//! guard across `.await` is not `Send`. These forms hold nothing: [`Recorder::begin_round`]
//! returns the round's [`RoundRef`] (`Copy + Send`), which [`Recorder::round_phase`],
//! [`Recorder::end_round`] and the verify parts take back. They push the same marks as
//! [`crate::RoundGuard`] and [`crate::PartGuard`], at the same cost. (Steps and sections have
//! theirs beside their guards: [`Recorder::begin_step`], [`Recorder::begin_section`].)

use super::Recorder;
use super::mark::{Mark, RoundRef};
use crate::config::SpecLevel;
use crate::vocab::{Phase, VerifyPart};

impl Recorder {
    /// Begins a speculative round of `k` drafted tokens without a guard, for a round whose
    /// body awaits (a scheduler's speculative step on a multi-thread runtime). Mark its phases
    /// with [`Recorder::round_phase`] and end it with [`Recorder::end_round`], passing the
    /// returned [`RoundRef`] (also what [`Recorder::verify_part`] takes on other threads).
    ///
    /// Same records, sampling and cost as [`Recorder::round`]. Off, the returned round is
    /// inert (the calls that take it do nothing). A round begun while another is open ends the
    /// open one unended, counted as unbalanced, as dropping its guard unended would.
    #[inline]
    pub fn begin_round(&self, k: u32) -> RoundRef {
        let guard = self.round(k);
        let round = guard.as_ref();
        // Its end is pushed by `end_round`.
        std::mem::forget(guard);
        self.begun_round.set(round.seq);
        round
    }

    /// Marks the end of `phase` in `round` (from [`Recorder::begin_round`] on this recorder):
    /// what [`crate::RoundGuard::phase`] does. A round that is not this recorder's open one
    /// (ended, or begun elsewhere) records nothing and counts one unbalanced record.
    #[inline]
    pub fn round_phase(&self, round: RoundRef, phase: Phase) {
        if self.begun(round) {
            self.push_timed(Mark::phase(phase));
        }
    }

    /// Ends `round` (from [`Recorder::begin_round`] on this recorder) with `accepted` of its
    /// drafted tokens accepted: what [`crate::RoundGuard::end`] does. Ending a round that is
    /// not open (ended already, or begun elsewhere) records nothing and counts one unbalanced
    /// record.
    #[inline]
    pub fn end_round(&self, round: RoundRef, accepted: u32) {
        if self.begun(round) {
            self.begun_round.set(0);
            self.push_timed(Mark::round_end(Some(accepted)));
        }
    }

    /// Begins a verify part of `round` without a guard (level 2), from any recorder of the
    /// round's threads; end it with [`Recorder::end_verify_part`]. Same records and cost as
    /// [`Recorder::verify_part`].
    #[inline]
    pub fn begin_verify_part(&self, round: RoundRef, part: VerifyPart) {
        std::mem::forget(self.verify_part(round, part));
    }

    /// Ends the verify part `part` of `round` begun by [`Recorder::begin_verify_part`].
    #[inline]
    pub fn end_verify_part(&self, round: RoundRef, part: VerifyPart) {
        if self.spec_level() != SpecLevel::VerifySplit || round.seq == 0 {
            return;
        }
        self.push_timed(Mark::part_end(part, round));
    }

    /// Whether `round` is the round this recorder began with `begin_round` and has not ended.
    /// An inert round (recording off) is not, silently; any other is counted as unbalanced.
    #[inline]
    fn begun(&self, round: RoundRef) -> bool {
        if round.seq == 0 {
            return false;
        }
        let open = round.lane == self.lane_id() && self.begun_round.get() == round.seq;
        if !open {
            self.count_unbalanced();
        }
        open
    }
}
