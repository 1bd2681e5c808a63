//! No panic is reachable from the public hot-path API: arbitrary sequences of calls (unbalanced
//! begin/end, wrong nesting, forgotten guards, huge layer ids, stale round handles, huge expert
//! ids and waits, begun rounds ended twice or with another round's handle, steps of any kind,
//! sections through the thread's installed recorder) are recorded, paired where they pair, and
//! counted where they do not.

use phasetrace::{
    Phase, Profiler, Recorder, Section, SectionKind, SectionLevel, Site, SpecLevel, StepKind,
    VerifyPart, current,
};
use proptest::prelude::*;
use std::time::Duration;

#[derive(Clone, Debug)]
enum Call {
    Begin(u8, u32),
    End(u8),
    Scoped(u8, usize),
    Host(u8),
    StepForgotten,
    Step,
    Wait(u64, u32),
    Route(Vec<u32>),
    Round(u32, Vec<u8>, Option<u32>),
    StalePart(u8),
    BeginRound(u32),
    RoundPhase(u8),
    EndRound(u32),
    BeginPart(u8),
    EndPart(u8),
    StepOf(u8),
    BeginStepOf(u8),
    EndStep,
    Current(u8, u32),
}

fn section(i: u8) -> Section {
    let all: Vec<Section> = Section::builtin().collect();
    match all.get(i as usize) {
        Some(s) => *s,
        None => Section::register(&format!("engine_{}", i % 8), SectionKind::Compute)
            .expect("valid name"),
    }
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        (any::<u8>(), any::<u32>()).prop_map(|(s, l)| Call::Begin(s, l)),
        any::<u8>().prop_map(Call::End),
        (any::<u8>(), any::<usize>()).prop_map(|(s, l)| Call::Scoped(s, l)),
        any::<u8>().prop_map(Call::Host),
        Just(Call::StepForgotten),
        Just(Call::Step),
        (any::<u64>(), any::<u32>()).prop_map(|(w, l)| Call::Wait(w, l)),
        proptest::collection::vec(any::<u32>(), 0..20).prop_map(Call::Route),
        (
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..8),
            proptest::option::of(any::<u32>())
        )
            .prop_map(|(k, p, a)| Call::Round(k, p, a)),
        any::<u8>().prop_map(Call::StalePart),
        any::<u32>().prop_map(Call::BeginRound),
        any::<u8>().prop_map(Call::RoundPhase),
        any::<u32>().prop_map(Call::EndRound),
        any::<u8>().prop_map(Call::BeginPart),
        any::<u8>().prop_map(Call::EndPart),
        any::<u8>().prop_map(Call::StepOf),
        any::<u8>().prop_map(Call::BeginStepOf),
        Just(Call::EndStep),
        (any::<u8>(), any::<u32>()).prop_map(|(s, l)| Call::Current(s, l)),
    ]
}

fn apply(rec: &Recorder, c: &Call, stale: &mut Option<phasetrace::RoundRef>) {
    match c {
        Call::Begin(s, l) => rec.begin_section(section(*s), *l, Site::ATTN),
        Call::End(s) => rec.end_section(section(*s)),
        Call::Scoped(s, l) => {
            let _g = rec.section(section(*s), *l, Site::MLP);
        }
        Call::Host(s) => {
            let _g = rec.host_section(section(*s), phasetrace::Layer::NONE, Site::NONE);
        }
        Call::StepForgotten => std::mem::forget(rec.step()),
        Call::Step => {
            let _s = rec.step();
        }
        Call::Wait(ns, l) => rec.collective_wait(Site::ATTN, *l, Duration::from_nanos(*ns)),
        Call::Route(ids) => rec.moe_route(7u32, ids),
        Call::Round(k, phases, accepted) => {
            let r = rec.round(*k);
            for p in phases {
                r.phase(Phase::ALL[*p as usize % 5]);
                let _v = rec.verify_part(r.as_ref(), VerifyPart::ALL[*p as usize % 4]);
            }
            *stale = Some(r.as_ref());
            match accepted {
                Some(a) => r.end(*a),
                None => drop(r),
            }
        }
        Call::StalePart(p) => {
            if let Some(r) = *stale {
                let _v = rec.verify_part(r, VerifyPart::ALL[*p as usize % 4]);
            }
        }
        Call::BeginRound(k) => *stale = Some(rec.begin_round(*k)),
        Call::RoundPhase(p) => {
            if let Some(r) = *stale {
                rec.round_phase(r, Phase::ALL[*p as usize % 5]);
            }
        }
        Call::EndRound(a) => {
            if let Some(r) = *stale {
                rec.end_round(r, *a);
            }
        }
        Call::BeginPart(p) => {
            if let Some(r) = *stale {
                rec.begin_verify_part(r, VerifyPart::ALL[*p as usize % 4]);
            }
        }
        Call::EndPart(p) => {
            if let Some(r) = *stale {
                rec.end_verify_part(r, VerifyPart::ALL[*p as usize % 4]);
            }
        }
        Call::StepOf(k) => {
            let _s = rec.step_of(StepKind::ALL[*k as usize % 4]);
        }
        Call::BeginStepOf(k) => rec.begin_step_of(StepKind::ALL[*k as usize % 4]),
        Call::EndStep => rec.end_step(),
        Call::Current(s, l) => {
            let _g = current::section(section(*s), *l, Site::ATTN);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_sequences_are_recorded_or_counted(calls in proptest::collection::vec(call(), 0..200)) {
        let p = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .with_spec_level(SpecLevel::VerifySplit)
            .without_prometheus()
            .with_expert_counter(true)
            .with_queue(256)
            .build()
            .expect("profiler");
        let rec = p.install_thread_recorder();
        let mut stale = None;
        for c in &calls {
            apply(&rec, c, &mut stale);
        }
        drop(rec);
        p.flush();
        let s = p.stats();
        prop_assert!(s.sections <= s.marks);
        p.shutdown();
        // After shutdown every call is a no-op, never a panic.
        let late = p.recorder();
        for c in &calls {
            apply(&late, c, &mut stale);
        }
    }
}
