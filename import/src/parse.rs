//! Line parsers for the four banked formats, as pure functions over bytes.
//!
//! ```text
//! raw line ──► split_prefix (ANSI + RFC 3339 timestamp) ──► find_marker ──► parse_* ──► typed line
//! ```
//!
//! Nothing here allocates for a line that carries no marker, and nothing panics on any input:
//! every number goes through [`parse_scaled`], which accepts plain decimals only and checks for
//! overflow, so garbage, `NaN`, exponents and huge values come back as a [`LineError`].
//!
//! Decimals are read as exact integers in nanoseconds together with half a unit of the last
//! printed digit, the widest rounding error the printer can have introduced. The reconstruction
//! of totals from the rounded per-token, per-call and per-round figures is interval arithmetic
//! over those bounds ([`reconstruct_row`], [`combine_total_and_per_round`]).

use std::fmt;

use phasetrace::vocab::{Phase, VerifyPart};

/// Why a candidate line could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LineError {
    /// A `key=` or literal the format requires is missing or out of order.
    Expected(&'static str),
    /// A field is present but is not a plain non-negative decimal that fits.
    BadNumber(&'static str),
    /// The numbers on the line contradict each other beyond their printed rounding.
    Inconsistent(&'static str),
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Expected(what) => write!(f, "expected {what}"),
            Self::BadNumber(what) => write!(f, "{what}: not a plain decimal in range"),
            Self::Inconsistent(what) => write!(f, "inconsistent numbers: {what}"),
        }
    }
}

/// Which format a line's marker announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    /// `GLM decode profile after ...`: the header of a decode-profile table.
    GlmHeader,
    /// `GLMTRACE step=...`: one route-trace line.
    RouteTrace,
    /// `[tag] rounds=...`: a speculative burst line, phase or verify split.
    Spec,
}

const GLM_HEADER: &[u8] = b"GLM decode profile after ";
const GLMTRACE: &[u8] = b"GLMTRACE ";
const SPEC: &[u8] = b"] rounds=";

/// Finds the first format marker in `line`; returns it with the offset where the marker starts.
///
/// One pass over the line looking for `G` or `]`; the marker text is compared only there.
pub(crate) fn find_marker(line: &[u8]) -> Option<(Marker, usize)> {
    let mut from = 0;
    while let Some(rel) = line
        .get(from..)?
        .iter()
        .position(|&b| b == b'G' || b == b']')
    {
        let at = from + rel;
        let rest = &line[at..];
        if rest.starts_with(GLMTRACE) {
            return Some((Marker::RouteTrace, at));
        }
        if rest.starts_with(GLM_HEADER) {
            return Some((Marker::GlmHeader, at));
        }
        if rest.starts_with(SPEC) {
            return Some((Marker::Spec, at));
        }
        from = at + 1;
    }
    None
}

/// Splits the leading ANSI escapes and RFC 3339 timestamp that `tracing`'s fmt layer prints.
///
/// Returns the timestamp in Unix nanoseconds when the line (after any `ESC [ ... letter`
/// sequences) starts with `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` followed by an escape, a space
/// or the end of the line. A timestamp without a zone is read as UTC.
pub(crate) fn line_timestamp(line: &[u8]) -> Option<u64> {
    let body = skip_ansi(line);
    let first = *body.first()?;
    if !first.is_ascii_digit() {
        return None;
    }
    parse_rfc3339(body)
}

/// Skips leading `ESC [ params letter` sequences.
fn skip_ansi(mut s: &[u8]) -> &[u8] {
    while let [0x1b, b'[', rest @ ..] = s {
        match rest.iter().position(|b| b.is_ascii_alphabetic()) {
            Some(end) => s = &rest[end + 1..],
            None => return &[],
        }
    }
    s
}

/// Copies `s` without any `ESC [ params letter` sequences into `out`.
pub(crate) fn strip_ansi_into(s: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut i = 0;
    while i < s.len() {
        if s[i] == 0x1b && s.get(i + 1) == Some(&b'[') {
            match s[i + 2..].iter().position(|b| b.is_ascii_alphabetic()) {
                Some(end) => i += 2 + end + 1,
                None => break,
            }
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
}

fn digits(s: &[u8], range: std::ops::Range<usize>) -> Option<u64> {
    let part = s.get(range)?;
    let mut v = 0u64;
    for &b in part {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(b - b'0');
    }
    Some(v)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (civil-from-days inverted).
fn days_from_civil(year: i64, month: u64, day: u64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn parse_rfc3339(s: &[u8]) -> Option<u64> {
    let sep = |i: usize, c: u8| s.get(i) == Some(&c);
    if !(sep(4, b'-') && sep(7, b'-') && (sep(10, b'T') || sep(10, b' ')) && sep(13, b':'))
        || !sep(16, b':')
    {
        return None;
    }
    let year = digits(s, 0..4)?;
    let month = digits(s, 5..7)?;
    let day = digits(s, 8..10)?;
    let hour = digits(s, 11..13)?;
    let minute = digits(s, 14..16)?;
    let second = digits(s, 17..19)?;
    if !(1970..=2500).contains(&year)
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut frac_ns = 0u64;
    if s.get(i) == Some(&b'.') {
        i += 1;
        let mut scale = 100_000_000u64;
        let start = i;
        while let Some(&b) = s.get(i).filter(|b| b.is_ascii_digit()) {
            frac_ns += u64::from(b - b'0') * scale;
            scale /= 10;
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let mut offset_s: i64 = 0;
    match s.get(i) {
        Some(b'Z') | Some(b'z') => i += 1,
        Some(&sign @ (b'+' | b'-')) => {
            if s.get(i + 3) != Some(&b':') {
                return None;
            }
            let oh = digits(s, i + 1..i + 3)?;
            let om = digits(s, i + 4..i + 6)?;
            if oh > 23 || om > 59 {
                return None;
            }
            let magnitude = (oh * 3600 + om * 60) as i64;
            offset_s = if sign == b'+' { magnitude } else { -magnitude };
            i += 6;
        }
        _ => {}
    }
    match s.get(i) {
        None | Some(b' ') | Some(b'\t') | Some(0x1b) => {}
        _ => return None,
    }
    let days = days_from_civil(year as i64, month, day);
    let secs = days * 86_400 + (hour * 3600 + minute * 60 + second) as i64 - offset_s;
    let secs = u64::try_from(secs).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

/// A decimal read exactly: `value` in units of `10^-scale`, `half_ulp` half a unit of the last
/// printed digit in the same units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scaled {
    /// The printed number times `10^scale`.
    pub(crate) value: u64,
    /// Half a unit of the last printed digit, times `10^scale`: the printer's rounding bound.
    pub(crate) half_ulp: u64,
}

/// Reads a plain decimal (`digits[.digits]`) as an exact integer times `10^scale`.
///
/// At most `scale` fractional digits and 20 integer digits; no sign, exponent, `inf` or `NaN`.
/// Returns `None` for anything else, including values that overflow `u64` once scaled.
pub(crate) fn parse_scaled(tok: &[u8], scale: u32) -> Option<Scaled> {
    let (int, frac) = match tok.iter().position(|&b| b == b'.') {
        Some(dot) => (&tok[..dot], &tok[dot + 1..]),
        None => (tok, &[][..]),
    };
    if int.is_empty() || int.len() > 20 || frac.len() > scale as usize {
        return None;
    }
    if tok.contains(&b'.') && frac.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in int.iter().chain(frac) {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    let missing = scale - frac.len() as u32;
    let unit = 10u64.checked_pow(missing)?;
    let value = v.checked_mul(unit)?;
    // Half a unit of the last printed digit; an integer printed at scale 0 rounds by 0.5, which
    // the callers never meet (their integer fields are exact counts).
    let half_ulp = unit / 2;
    Some(Scaled { value, half_ulp })
}

fn parse_count(tok: &[u8], what: &'static str) -> Result<u64, LineError> {
    match parse_scaled(tok, 0) {
        Some(s) if !tok.contains(&b'.') => Ok(s.value),
        _ => Err(LineError::BadNumber(what)),
    }
}

/// Splits on ASCII spaces and tabs, skipping empty pieces.
fn tokens(s: &[u8]) -> impl Iterator<Item = &[u8]> {
    s.split(|&b| b == b' ' || b == b'\t')
        .filter(|t| !t.is_empty())
}

fn field<'a>(tok: Option<&'a [u8]>, key: &'static str) -> Result<&'a [u8], LineError> {
    tok.and_then(|t| t.strip_prefix(key.as_bytes()))
        .ok_or(LineError::Expected(key))
}

fn literal(tok: Option<&[u8]>, lit: &'static str) -> Result<(), LineError> {
    if tok == Some(lit.as_bytes()) {
        Ok(())
    } else {
        Err(LineError::Expected(lit))
    }
}

/// Nanoseconds in one millisecond, the scale of `parse_scaled(.., 6)` for millisecond fields.
const MS: u32 = 6;
/// Nanoseconds in one microsecond, the scale of `parse_scaled(.., 3)` for microsecond fields.
const US: u32 = 3;

fn ms_field(tok: &[u8], what: &'static str) -> Result<Scaled, LineError> {
    parse_scaled(tok, MS).ok_or(LineError::BadNumber(what))
}

/// A decode-profile header: `GLM decode profile after {steps} steps — {ms:.2} ms/token ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GlmHeader {
    /// Decode steps counted since the process started.
    pub(crate) steps: u64,
    /// Mean profiled time per token over those steps, nanoseconds with rounding bound.
    pub(crate) ns_per_token: Scaled,
}

/// Parses a header from its marker (`GLM decode profile after ...`) to the end of the line.
pub(crate) fn parse_glm_header(from_marker: &[u8]) -> Result<GlmHeader, LineError> {
    let rest = &from_marker[GLM_HEADER.len().min(from_marker.len())..];
    let mut t = tokens(rest);
    let steps = parse_count(t.next().ok_or(LineError::Expected("steps"))?, "steps")?;
    if steps == 0 {
        return Err(LineError::BadNumber("steps"));
    }
    literal(t.next(), "steps")?;
    // The separator is an em dash in the source; a lossy conversion may have replaced it.
    t.next().ok_or(LineError::Expected("dash"))?;
    let ns_per_token = ms_field(t.next().ok_or(LineError::Expected("ms"))?, "ms/token")?;
    literal(t.next(), "ms/token")?;
    Ok(GlmHeader {
        steps,
        ns_per_token,
    })
}

/// One table row as printed: per-token time, share, per-token calls, per-call time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GlmRow<'a> {
    /// The bucket name (first column).
    pub(crate) name: &'a [u8],
    /// Time per token, nanoseconds with rounding bound.
    pub(crate) ns_per_token: Scaled,
    /// Calls per token, integer-divided by the printer.
    pub(crate) calls_per_token: u64,
    /// Time per call, nanoseconds with rounding bound.
    pub(crate) ns_per_call: Scaled,
}

/// Whether a line looks like a table row: two leading spaces and the `us/call` suffix.
pub(crate) fn looks_like_row(line: &[u8]) -> bool {
    line.starts_with(b"  ") && trim_end(line).ends_with(b" us/call")
}

/// Whether a line is indented like a table row (used inside a table, where a cut row has lost
/// its suffix).
pub(crate) fn indented_like_row(line: &[u8]) -> bool {
    line.starts_with(b"  ") && line.get(2).is_some_and(|b| !b.is_ascii_whitespace())
}

/// Trims trailing ASCII whitespace (the `\r` of CRLF files included).
pub(crate) fn trim_end(s: &[u8]) -> &[u8] {
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |p| p + 1);
    &s[..end]
}

/// Parses a row: `  {name} {ms} ms/tok  {pct}%  {calls} calls/tok  {us} us/call`.
pub(crate) fn parse_glm_row(line: &[u8]) -> Result<GlmRow<'_>, LineError> {
    let mut t = tokens(line);
    let name = t.next().ok_or(LineError::Expected("bucket name"))?;
    if name.len() > 64 || name.iter().any(|b| b.is_ascii_control()) {
        return Err(LineError::Expected("bucket name"));
    }
    let ns_per_token = ms_field(t.next().ok_or(LineError::Expected("ms"))?, "ms/tok")?;
    literal(t.next(), "ms/tok")?;
    let pct = t.next().ok_or(LineError::Expected("%"))?;
    let pct = pct.strip_suffix(b"%").ok_or(LineError::Expected("%"))?;
    parse_scaled(pct, 1).ok_or(LineError::BadNumber("%"))?;
    let calls_per_token = parse_count(t.next().ok_or(LineError::Expected("calls"))?, "calls/tok")?;
    literal(t.next(), "calls/tok")?;
    let us = t.next().ok_or(LineError::Expected("us"))?;
    let ns_per_call = parse_scaled(us, US).ok_or(LineError::BadNumber("us/call"))?;
    literal(t.next(), "us/call")?;
    if t.next().is_some() {
        return Err(LineError::Expected("end of row"));
    }
    Ok(GlmRow {
        name,
        ns_per_token,
        calls_per_token,
        ns_per_call,
    })
}

/// A closed interval of nanoseconds (or calls) that holds the truth, `lo <= center <= hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Smallest value consistent with the printed figures.
    pub(crate) lo: u128,
    /// Largest value consistent with the printed figures.
    pub(crate) hi: u128,
    /// The estimate: the printed figure itself (times its multiplier), kept inside the bounds.
    pub(crate) center: u128,
}

impl Bounds {
    /// `(v ± half_ulp) × n`, widened by one part in 2^40 of `v` for the printer's own `f64`
    /// arithmetic (which can only move a value that sits on a rounding boundary).
    fn scaled(v: Scaled, n: u64) -> Self {
        let err = u128::from(v.half_ulp) + u128::from(v.value >> 40);
        let v = u128::from(v.value);
        let n = u128::from(n);
        Self {
            lo: v.saturating_sub(err).saturating_mul(n),
            hi: (v + err).saturating_mul(n),
            center: v.saturating_mul(n),
        }
    }

    /// Both constraints at once. The estimate is the tighter interval's printed figure, moved
    /// into the intersection: an exactly printed figure (a zero, a round number) comes back
    /// exactly, and the result never leaves what both figures allow.
    fn intersect(self, other: Self) -> Option<Self> {
        let lo = self.lo.max(other.lo);
        let hi = self.hi.min(other.hi);
        let tighter = if other.hi - other.lo < self.hi - self.lo {
            other
        } else {
            self
        };
        if lo > hi {
            return None;
        }
        Some(Self {
            lo,
            hi,
            center: tighter.center.clamp(lo, hi),
        })
    }

    /// The estimate, or `None` when it does not fit a `u64`.
    pub(crate) fn best(self) -> Option<u64> {
        u64::try_from(self.center).ok()
    }

    /// The largest distance from the estimate to a value the bounds allow.
    fn error(self) -> u64 {
        u64::try_from((self.center - self.lo).max(self.hi - self.center)).unwrap_or(u64::MAX)
    }
}

/// A cumulative bucket total recovered from one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowTotals {
    /// Total nanoseconds since process start: the estimate of everything the row allows.
    pub(crate) total_ns: u64,
    /// Calls since process start.
    pub(crate) calls: u64,
    /// Largest distance from `total_ns` to a total the row allows: the error bound.
    pub(crate) total_err_ns: u64,
}

/// Recovers a bucket's cumulative nanoseconds and calls from one row of a table after `steps`.
///
/// Three printed figures constrain the truth (`T` ns, `C` calls):
/// - `ms/tok` gives `T ∈ (ms ± 0.005 ms) × steps`;
/// - `calls/tok` is `C / steps` integer-divided, so `C ∈ [c × steps, c × steps + steps − 1]`
///   (and `C ≥ 1`, since rows with no call are not printed);
/// - `us/call` gives `T ∈ (us ± 0.05 µs) × C`.
///
/// `C` is `c × steps` when that is feasible (exact for a bucket called a fixed number of times
/// per step, the common case), else the feasible integer closest to `ms × steps / us`. `T` lies
/// in the intersection of the two `T` intervals for that `C` (see `Bounds::intersect` for the
/// point taken). The truth and the estimate both lie within the tighter interval's half-width
/// of its printed centre, and clamping only moves the estimate towards the truth, so the error
/// is at most `min(5 µs × steps, 50 ns × C)` plus float slack; the bound is returned.
pub(crate) fn reconstruct_row(row: &GlmRow<'_>, steps: u64) -> Result<RowTotals, LineError> {
    let by_token = Bounds::scaled(row.ns_per_token, steps);
    let per_call = row.ns_per_call;
    let s = u128::from(steps);
    let c = u128::from(row.calls_per_token);
    // c and s are below 2^64, so c × s + s − 1 < 2^128.
    let mut lo = (c * s).max(1);
    let mut hi = c * s + s - 1;
    let call = Bounds::scaled(per_call, 1);
    // Calls consistent with by_token and the per-call bounds.
    if call.hi > 0 {
        lo = lo.max(by_token.lo.div_ceil(call.hi));
    }
    if let Some(max_calls) = by_token.hi.checked_div(call.lo) {
        hi = hi.min(max_calls);
    }
    if lo > hi {
        return Err(LineError::Inconsistent(
            "calls/tok, ms/tok and us/call disagree",
        ));
    }
    // A bucket is usually called a fixed number of times per step, and then `c × steps` is
    // the truth; the ratio of the rounded figures is too coarse to beat that prior.
    let calls = if (lo..=hi).contains(&(c * s)) {
        c * s
    } else if per_call.value > 0 {
        let mid = u128::from(row.ns_per_token.value) * s;
        ((mid + u128::from(per_call.value) / 2) / u128::from(per_call.value)).clamp(lo, hi)
    } else {
        lo
    };
    let calls_u64 = u64::try_from(calls).map_err(|_| LineError::BadNumber("calls"))?;
    let by_call = Bounds {
        lo: call.lo.saturating_mul(calls),
        hi: call.hi.saturating_mul(calls),
        center: u128::from(per_call.value).saturating_mul(calls),
    };
    let total = by_token
        .intersect(by_call)
        .ok_or(LineError::Inconsistent("ms/tok and us/call disagree"))?;
    let total_ns = total.best().ok_or(LineError::BadNumber("total"))?;
    let total_err_ns = total.error();
    Ok(RowTotals {
        total_ns,
        calls: calls_u64,
        total_err_ns,
    })
}

/// The header's cumulative decode time bounds (`ms/token × steps`).
pub(crate) fn header_bounds(h: &GlmHeader) -> Bounds {
    Bounds::scaled(h.ns_per_token, h.steps)
}

/// Whether the rows' per-token times add up to the header's, within the rounding of each.
///
/// Each printed figure is within half a unit (5 µs per token) of the truth and the rows' true
/// times add up to the header's, so a complete table satisfies
/// `|Σ rows − header| ≤ (rows + 1) × 5 µs`. Rows missing from a truncated table are
/// the smallest ones (rows are sorted by time); rows that print as `0.00` cannot be missed this
/// way, which costs nothing: their time lands in the next table's interval.
pub(crate) fn rows_cover_header(header: &GlmHeader, row_ns_per_token: &[Scaled]) -> bool {
    let sum: u128 = row_ns_per_token.iter().map(|r| u128::from(r.value)).sum();
    let slack: u128 = row_ns_per_token
        .iter()
        .chain(std::iter::once(&header.ns_per_token))
        .map(|r| u128::from(r.half_ulp) + u128::from(r.value >> 40))
        .sum();
    let want = u128::from(header.ns_per_token.value);
    sum + slack >= want && sum <= want + slack
}

/// The longest rendezvous probe a route-trace line may state: one hour.
pub(crate) const MAX_PROBE_NS: u64 = 3_600 * 1_000_000_000;

/// A route-trace line: `GLMTRACE step= site= L= moe= bar_us= ids=`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteLine<'a> {
    /// Decode steps completed when the line was logged.
    pub(crate) step: u64,
    /// The reduce site (`attn` or `mlp` in the reference).
    pub(crate) site: &'a [u8],
    /// Layer index.
    pub(crate) layer: u32,
    /// Whether the layer's MLP is routed.
    pub(crate) moe: bool,
    /// Rendezvous probe time in nanoseconds (printed in µs with one decimal: ±50 ns).
    pub(crate) bar_ns: u64,
    /// Expert ids last read back.
    pub(crate) expert_ids: Vec<u32>,
}

/// Parses a route-trace line from its marker to the end of the line.
pub(crate) fn parse_route_trace(from_marker: &[u8]) -> Result<RouteLine<'_>, LineError> {
    let rest = &from_marker[GLMTRACE.len().min(from_marker.len())..];
    let mut t = tokens(rest);
    let step = parse_count(field(t.next(), "step=")?, "step")?;
    let site = field(t.next(), "site=")?;
    if site.is_empty() || site.len() > 32 || site.iter().any(|b| b.is_ascii_control()) {
        return Err(LineError::Expected("site name"));
    }
    let layer = parse_count(field(t.next(), "L=")?, "L")?;
    let layer = u32::try_from(layer).map_err(|_| LineError::BadNumber("L"))?;
    let moe = match field(t.next(), "moe=")? {
        b"0" => false,
        b"1" => true,
        _ => return Err(LineError::BadNumber("moe")),
    };
    let bar =
        parse_scaled(field(t.next(), "bar_us=")?, US).ok_or(LineError::BadNumber("bar_us"))?;
    // A probe is one rendezvous: longer than an hour is no measurement (and would move the
    // run's start, which is placed before its records by what they measured, decades back).
    if bar.value > MAX_PROBE_NS {
        return Err(LineError::BadNumber("bar_us"));
    }
    let ids = field(t.next(), "ids=")?;
    if t.next().is_some() {
        return Err(LineError::Expected("end of line after ids"));
    }
    let mut expert_ids = Vec::new();
    if !ids.is_empty() {
        expert_ids.reserve(ids.len() / 2 + 1);
        for id in ids.split(|&b| b == b',') {
            let v = parse_count(id, "ids")?;
            expert_ids.push(u32::try_from(v).map_err(|_| LineError::BadNumber("ids"))?);
        }
    }
    Ok(RouteLine {
        step,
        site,
        layer,
        moe,
        bar_ns: bar.value,
        expert_ids,
    })
}

/// Per-burst phase totals in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecPhases {
    /// Drafting the candidate tokens.
    pub draft_ns: u64,
    /// Verifying them with the target model.
    pub verify_ns: u64,
    /// Accepting the verified prefix.
    pub accept_ns: u64,
    /// Rolling back the rejected suffix.
    pub rollback_ns: u64,
    /// Source maintenance between rounds.
    pub maint_ns: u64,
}

impl SpecPhases {
    /// Each phase with its total, in round order.
    pub fn by_phase(&self) -> [(Phase, u64); 5] {
        [
            (Phase::Draft, self.draft_ns),
            (Phase::Verify, self.verify_ns),
            (Phase::Accept, self.accept_ns),
            (Phase::Rollback, self.rollback_ns),
            (Phase::Maint, self.maint_ns),
        ]
    }

    /// Sum of the five phases.
    pub fn total_ns(&self) -> u64 {
        self.draft_ns
            .saturating_add(self.verify_ns)
            .saturating_add(self.accept_ns)
            .saturating_add(self.rollback_ns)
            .saturating_add(self.maint_ns)
    }
}

/// Level-2 verify sub-split totals over one burst, in nanoseconds.
///
/// `kda_scan_ns` is part of `kda_ns` and `ffn_ns` is part of `rest_ns`, as in the source line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerifyParts {
    /// KDA mixer time inside verify.
    pub kda_ns: u64,
    /// The sequential scan inside the KDA time.
    pub kda_scan_ns: u64,
    /// MLA mixer time inside verify.
    pub mla_ns: u64,
    /// Verify time outside the mixers (glue, FFN/MoE, head).
    pub rest_ns: u64,
    /// FFN/MoE time inside the rest.
    pub ffn_ns: u64,
}

impl VerifyParts {
    /// Each `part` value (the `vocab::VerifyPart` names and the derived `rest`) with its
    /// total, in the order of the verify-split line.
    pub fn by_part(&self) -> [(&'static str, u64); 5] {
        [
            (VerifyPart::Kda.as_str(), self.kda_ns),
            (VerifyPart::KdaScan.as_str(), self.kda_scan_ns),
            (VerifyPart::Mla.as_str(), self.mla_ns),
            (VerifyPart::REST, self.rest_ns),
            (VerifyPart::Ffn.as_str(), self.ffn_ns),
        ]
    }
}

/// A parsed speculative line of either kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SpecLine<'a> {
    /// `[tag] rounds= k= total=..ms | draft= ... | per-round ms: ...`.
    Phases {
        /// The caller's tag, without brackets.
        tag: &'a [u8],
        /// Rounds in the burst.
        rounds: u64,
        /// Draft length.
        k: u32,
        /// Phase totals over the burst.
        phases: SpecPhases,
    },
    /// `[tag] rounds= k= | per-round ms: vkda= (scan=) vmla= vrest= (vffn=)`.
    VerifySplit {
        /// The caller's tag, without brackets.
        tag: &'a [u8],
        /// Rounds in the burst.
        rounds: u64,
        /// Draft length.
        k: u32,
        /// Part totals over the burst (per-round figures times rounds).
        parts: VerifyParts,
    },
}

/// Combines a burst total printed in ms with two decimals and a per-round figure printed with
/// three: the truth lies in both `total ± 5 µs` and `(per_round ± 0.5 µs) × rounds`.
pub(crate) fn combine_total_and_per_round(
    total: Scaled,
    per_round: Scaled,
    rounds: u64,
) -> Result<u64, LineError> {
    Bounds::scaled(total, 1)
        .intersect(Bounds::scaled(per_round, rounds))
        .ok_or(LineError::Inconsistent(
            "burst total and per-round figure disagree",
        ))?
        .best()
        .ok_or(LineError::BadNumber("phase total"))
}

/// Parses a speculative line from the `]` of its tag; `line` is the whole line, for the tag.
pub(crate) fn parse_spec(line: &[u8], marker_at: usize) -> Result<SpecLine<'_>, LineError> {
    let open = line[..marker_at]
        .iter()
        .rposition(|&b| b == b'[')
        .ok_or(LineError::Expected("[tag]"))?;
    let tag = &line[open + 1..marker_at];
    if tag.is_empty() || tag.len() > 128 || tag.iter().any(|b| b.is_ascii_control()) {
        return Err(LineError::Expected("[tag]"));
    }
    let rest = &line[marker_at + 2..];
    let mut t = tokens(rest);
    let rounds = parse_count(field(t.next(), "rounds=")?, "rounds")?;
    if rounds == 0 {
        return Err(LineError::BadNumber("rounds"));
    }
    let k = parse_count(field(t.next(), "k=")?, "k")?;
    let k = u32::try_from(k).map_err(|_| LineError::BadNumber("k"))?;
    let next = t.next();
    if next == Some(b"|".as_slice()) {
        literal(t.next(), "per-round")?;
        literal(t.next(), "ms:")?;
        let mut part = |key: &'static str, open: &'static str| -> Result<u64, LineError> {
            let tok = t.next().ok_or(LineError::Expected(key))?;
            let tok = tok
                .strip_prefix(open.as_bytes())
                .ok_or(LineError::Expected(key))?;
            let tok = if open.is_empty() {
                tok
            } else {
                tok.strip_suffix(b")").ok_or(LineError::Expected(")"))?
            };
            let v = parse_scaled(field(Some(tok), key)?, MS).ok_or(LineError::BadNumber(key))?;
            v.value.checked_mul(rounds).ok_or(LineError::BadNumber(key))
        };
        let parts = VerifyParts {
            kda_ns: part("vkda=", "")?,
            kda_scan_ns: part("scan=", "(")?,
            mla_ns: part("vmla=", "")?,
            rest_ns: part("vrest=", "")?,
            ffn_ns: part("vffn=", "(")?,
        };
        if t.next().is_some() {
            return Err(LineError::Expected("end of line after vffn"));
        }
        return Ok(SpecLine::VerifySplit {
            tag,
            rounds,
            k,
            parts,
        });
    }
    let total = field(next, "total=")?
        .strip_suffix(b"ms")
        .ok_or(LineError::Expected("total=..ms"))?;
    let total = ms_field(total, "total")?;
    literal(t.next(), "|")?;
    const KEYS: [&str; 5] = ["draft=", "verify=", "accept=", "roll=", "maint="];
    let mut totals = [Scaled {
        value: 0,
        half_ulp: 0,
    }; 5];
    for (slot, key) in totals.iter_mut().zip(KEYS) {
        *slot = ms_field(field(t.next(), key)?, key)?;
    }
    literal(t.next(), "|")?;
    literal(t.next(), "per-round")?;
    literal(t.next(), "ms:")?;
    let mut ns = [0u64; 5];
    for ((slot, key), sum) in ns.iter_mut().zip(KEYS).zip(totals) {
        let per = ms_field(field(t.next(), key)?, key)?;
        *slot = combine_total_and_per_round(sum, per, rounds)?;
    }
    let per_total = ms_field(field(t.next(), "total=")?, "per-round total")?;
    if t.next().is_some() {
        return Err(LineError::Expected("end of line after total"));
    }
    let phases = SpecPhases {
        draft_ns: ns[0],
        verify_ns: ns[1],
        accept_ns: ns[2],
        rollback_ns: ns[3],
        maint_ns: ns[4],
    };
    // The printed totals are roundings of the same sum: the phases must add up to both.
    let burst = combine_total_and_per_round(total, per_total, rounds)
        .map_err(|_| LineError::Inconsistent("total and per-round total disagree"))?;
    let sum = phases.total_ns();
    // Each of the six estimates is within the half-width of its tighter interval (5 µs plus
    // the slack of `Bounds::scaled`) of its true value, and the true phases add up exactly.
    let slack = 6 * 5_002 + (burst >> 29);
    if sum.abs_diff(burst) > slack {
        return Err(LineError::Inconsistent("phases do not add up to total"));
    }
    Ok(SpecLine::Phases {
        tag,
        rounds,
        k,
        phases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_decimals_are_exact_integers_with_their_rounding_bound() {
        assert_eq!(
            parse_scaled(b"12.34", 6),
            Some(Scaled {
                value: 12_340_000,
                half_ulp: 5_000
            })
        );
        assert_eq!(parse_scaled(b"0.5", 3).map(|s| s.value), Some(500));
        assert_eq!(
            parse_scaled(b"7", 3).map(|s| (s.value, s.half_ulp)),
            Some((7000, 500))
        );
        for bad in [
            &b""[..],
            b".",
            b"1.",
            b".5",
            b"-1",
            b"1e3",
            b"NaN",
            b"inf",
            b"1.2.3",
            b"1.2345678",
            b"99999999999999999999999",
            b"18446744073709551615",
        ] {
            assert_eq!(
                parse_scaled(bad, 6),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            parse_scaled(b"18446744073709551615", 0).map(|s| s.value),
            Some(u64::MAX)
        );
    }

    #[test]
    fn timestamps_parse_with_ansi_fraction_and_offset() {
        let base = 1_790_769_601_000_000_000; // 2026-09-30T12:00:01Z
        assert_eq!(line_timestamp(b"2026-09-30T12:00:01Z x"), Some(base));
        assert_eq!(
            line_timestamp(b"2026-09-30T12:00:01.123456Z  WARN t: m"),
            Some(base + 123_456_000)
        );
        assert_eq!(
            line_timestamp(b"\x1b[2m2026-09-30T12:00:01.5Z\x1b[0m \x1b[33m WARN\x1b[0m"),
            Some(base + 500_000_000)
        );
        assert_eq!(line_timestamp(b"2026-09-30T14:00:01+02:00 x"), Some(base));
        assert_eq!(line_timestamp(b"2026-02-30"), None);
        assert_eq!(line_timestamp(b"2026-09-30T12:00:01Zjunk"), None);
        assert_eq!(line_timestamp(b"12:00:01 x"), None);
        assert_eq!(line_timestamp(b"[glm5-phase] rounds=1"), None);
        assert_eq!(line_timestamp(b"\x1b[2m"), None);
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn markers_are_found_anywhere_in_the_line() {
        assert_eq!(
            find_marker(b"x: GLMTRACE step=1"),
            Some((Marker::RouteTrace, 3))
        );
        assert_eq!(
            find_marker(b"GGLM decode profile after 8 steps"),
            Some((Marker::GlmHeader, 1))
        );
        assert_eq!(find_marker(b"[a]] rounds=3"), Some((Marker::Spec, 3)));
        assert_eq!(find_marker(b"GLM ] rounds"), None);
        assert_eq!(find_marker(b""), None);
    }

    #[test]
    fn a_row_reconstructs_calls_and_total_within_the_stated_bound() {
        // 78 calls per step for 16 steps, 41.23 us each.
        let steps = 16;
        let calls = 78 * steps;
        let total_ns: u64 = 41_230 * calls;
        let ms_tok = total_ns as f64 / 1e6 / steps as f64;
        let us_call = total_ns as f64 / 1e3 / calls as f64;
        let line = format!(
            "  {:<13} {:>8.2} ms/tok  {:>6.1}%  {:>5} calls/tok  {:>7.1} us/call",
            "moe_experts",
            ms_tok,
            40.0,
            calls / steps,
            us_call
        );
        let row = parse_glm_row(line.as_bytes()).expect("row");
        let got = reconstruct_row(&row, steps).expect("reconstruct");
        assert_eq!(got.calls, calls);
        assert!(got.total_ns.abs_diff(total_ns) <= got.total_err_ns);
        assert!(got.total_err_ns <= 50 * calls + 100);
    }

    #[test]
    fn row_rejects_contradictions_and_cut_lines() {
        let ok = b"  norm              0.50 ms/tok     4.0%     10 calls/tok      6.2 us/call";
        assert!(parse_glm_row(ok).is_ok());
        for cut in 1..ok.len() - 1 {
            let line = &ok[..cut];
            if let Ok(row) = parse_glm_row(line) {
                panic!("cut row parsed: {row:?}");
            }
        }
        // 0.50 ms/tok at 10 calls/tok cannot be 600 us per call.
        let bad = b"  norm              0.50 ms/tok     4.0%     10 calls/tok    600.0 us/call";
        let row = parse_glm_row(bad).expect("syntax is fine");
        assert!(matches!(
            reconstruct_row(&row, 8),
            Err(LineError::Inconsistent(_))
        ));
    }

    #[test]
    fn route_trace_lines_parse_with_and_without_ids() {
        let l = parse_route_trace(b"GLMTRACE step=8 site=attn L=3 moe=1 bar_us=12.5 ids=4,17,250")
            .expect("parse");
        assert_eq!(
            (l.step, l.site, l.layer, l.moe, l.bar_ns),
            (8, &b"attn"[..], 3, true, 12_500)
        );
        assert_eq!(l.expert_ids, vec![4, 17, 250]);
        let l = parse_route_trace(b"GLMTRACE step=0 site=mlp L=0 moe=0 bar_us=0.0 ids=")
            .expect("parse");
        assert!(l.expert_ids.is_empty());
        for bad in [
            &b"GLMTRACE step=0 site=mlp L=0 moe=2 bar_us=0.0 ids="[..],
            b"GLMTRACE step=0 site=mlp L=0 moe=0 bar_us=-1.0 ids=",
            b"GLMTRACE step=0 site=mlp L=0 moe=0 bar_us=0.0 ids=1,,2",
            b"GLMTRACE step=0 site=mlp L=0 moe=0 bar_us=0.0 ids=-1",
            b"GLMTRACE step=0 site=mlp L=0 moe=0 bar_us=0.0",
            b"GLMTRACE step=0 site=mlp L=99999999999 moe=0 bar_us=0.0 ids=",
            b"GLMTRACE step=0 site=mlp L=0 moe=0 bar_us=18446744073709551.615 ids=",
            b"GLMTRACE step=0 site=mlp L=0 moe=0 bar_us=3600000000.1 ids=",
        ] {
            assert!(
                parse_route_trace(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn spec_lines_parse_both_kinds() {
        let line = b"[glm5-phase] rounds=4 k=3 total=10.00ms | draft=2.00 verify=6.00 accept=1.00 roll=0.50 maint=0.50 | per-round ms: draft=0.500 verify=1.500 accept=0.250 roll=0.125 maint=0.125 total=2.500";
        let (m, at) = find_marker(line).expect("marker");
        assert_eq!(m, Marker::Spec);
        let SpecLine::Phases {
            tag,
            rounds,
            k,
            phases,
        } = parse_spec(line, at).expect("parse")
        else {
            panic!("wrong kind")
        };
        assert_eq!((tag, rounds, k), (&b"glm5-phase"[..], 4, 3));
        assert_eq!(phases.verify_ns, 6_000_000);
        assert_eq!(phases.total_ns(), 10_000_000);
        let v = b"[glm5-phase-v] rounds=4 k=3 | per-round ms: vkda=0.400 (scan=0.100) vmla=0.300 vrest=0.800 (vffn=0.600)";
        let (_, at) = find_marker(v).expect("marker");
        let SpecLine::VerifySplit { tag, parts, .. } = parse_spec(v, at).expect("parse") else {
            panic!("wrong kind")
        };
        assert_eq!(tag, b"glm5-phase-v");
        assert_eq!(parts.kda_ns, 1_600_000);
        assert_eq!(parts.ffn_ns, 2_400_000);
    }

    #[test]
    fn spec_lines_with_contradicting_numbers_are_rejected() {
        // draft total says 2.00 ms but per-round says 0.9 x 4 = 3.6 ms.
        let line = b"[t] rounds=4 k=3 total=10.00ms | draft=2.00 verify=6.00 accept=1.00 roll=0.50 maint=0.50 | per-round ms: draft=0.900 verify=1.500 accept=0.250 roll=0.125 maint=0.125 total=2.500";
        let (_, at) = find_marker(line).expect("marker");
        assert!(matches!(
            parse_spec(line, at),
            Err(LineError::Inconsistent(_))
        ));
        // The phases add to 10 ms but the total claims 20 ms.
        let line = b"[t] rounds=4 k=3 total=20.00ms | draft=2.00 verify=6.00 accept=1.00 roll=0.50 maint=0.50 | per-round ms: draft=0.500 verify=1.500 accept=0.250 roll=0.125 maint=0.125 total=5.000";
        let (_, at) = find_marker(line).expect("marker");
        assert!(matches!(
            parse_spec(line, at),
            Err(LineError::Inconsistent(_))
        ));
    }

    #[test]
    fn ansi_sequences_are_stripped() {
        let mut out = Vec::new();
        strip_ansi_into(b"\x1b[3mids\x1b[0m=1 \x1b[2", &mut out);
        assert_eq!(out, b"ids=1 ");
    }
}
