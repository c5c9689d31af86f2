//! Time zones as people and models spell them: IANA names, case-insensitive.

/// A name that is no IANA time zone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown time zone `{0}`: use an IANA name such as `Europe/Paris`, `America/New_York` or `UTC`"
)]
pub struct UnknownTimeZone(pub String);

/// Resolve an IANA time zone name (case-insensitive, surrounding spaces ignored).
///
/// # Errors
/// [`UnknownTimeZone`], naming the zone and how to spell one.
pub fn parse_timezone(name: &str) -> Result<chrono_tz::Tz, UnknownTimeZone> {
    let name = name.trim();
    if let Ok(tz) = name.parse::<chrono_tz::Tz>() {
        return Ok(tz);
    }
    chrono_tz::TZ_VARIANTS
        .iter()
        .find(|tz| tz.name().eq_ignore_ascii_case(name))
        .copied()
        .ok_or_else(|| UnknownTimeZone(name.to_owned()))
}
