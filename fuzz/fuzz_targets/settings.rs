//! Every setting's value, and the vocabulary's names: no panic; a value a setting accepts in
//! its variable is accepted by `with_text` and `config()` alike (one verdict), and a value
//! `check` prints reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phasetrace::Profiler;
use phasetrace::config::settings::SETTINGS;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let s = SETTINGS[usize::from(pick) % SETTINGS.len()];
    let checked = s.check(text).is_ok();
    let built = Profiler::builder().without_env().with_text(s.var(), text);
    assert_eq!(checked, built.is_ok(), "{}={text:?}", s.var());
    if let Ok(b) = built
        && let Ok(cfg) = b.config()
    {
        let _ = s.shown(&cfg);
        assert!(
            s.round_trips(&cfg).is_ok(),
            "{}={text:?}: {:?}",
            s.var(),
            s.round_trips(&cfg)
        );
    }
    // The vocabulary: a name registered reads back as itself, found by lookup.
    use phasetrace::{Section, SectionKind, Site};
    let kind = [
        SectionKind::Compute,
        SectionKind::Collective,
        SectionKind::Probe,
    ][usize::from(pick) % 3];
    if let Ok(section) = Section::register(text, kind) {
        assert_eq!(section.as_str(), text);
        assert_eq!(Section::lookup(text).map(Section::id), Some(section.id()));
    }
    if let Ok(site) = Site::register(text) {
        assert_eq!(site.as_str(), Some(text));
    }
});
