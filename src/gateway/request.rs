//! The request path, step by step: check what the head says (the request
//! ids, the path, the attempt, the caller: [`check_head`], which the
//! connection runs before it reads a byte of the body), read the bounded
//! body, decide under the core's lock (once), wait for a queued turn, count
//! the outcome, and forward what passed.

#![expect(
    clippy::result_large_err,
    reason = "a step's error is the answer for the client, made once per refused request"
)]

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::Response;
use http_body_util::BodyExt;
use lanes::{Outcome, Resolution, Ticket, Verdict};
use tokio::sync::oneshot;

use super::body_budget::{BodyClass, BodyHold};
use super::decision::{
    self, IDEMPOTENCY_KEY, MAX_REQUEST_ID, REQUEST_ID, Record, client_request_id,
};
use super::dispatch::Dispatch;
use super::identity::{self, IdentityKind};
use super::metrics::{LaneMeter, TenantClass};
use super::respond;
use super::state::{Gateway, Resolved, State as Locked};
use super::surface::OnSurface;
use super::token_size;
use super::upstream::{Outgoing, forward};

/// The attempt header.
const ATTEMPT_HEADER: &str = "x-lanekeeper-attempt";

/// What the client asked for, from its headers.
#[derive(Clone)]
struct Asked {
    lane: Option<String>,
    tenant: Option<String>,
    attempt: Option<u32>,
    request_id: Option<String>,
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The attempt number: absent (an original), or an integer >= 1 written
/// in plain digits. Anything else — `0`, `-1`, `1.5`, `abc`, a number
/// beyond `u32`, a value that is not text — is the client's error.
fn attempt(h: &HeaderMap) -> Result<Option<u32>, Response> {
    let Some(raw) = h.get(ATTEMPT_HEADER) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(raw.as_bytes());
    let v = text.trim();
    match v.parse::<u32>() {
        Ok(n) if n >= 1 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(n)),
        _ => Err(respond::invalid_attempt(ATTEMPT_HEADER, v)),
    }
}

impl Asked {
    /// `request_id` is the one [`admissible`] checked.
    fn read(h: &HeaderMap, gw: &Gateway, request_id: Option<String>) -> Result<Asked, Response> {
        Ok(Asked {
            lane: header_str(h, &gw.args.lane_header).map(str::to_owned),
            tenant: header_str(h, &gw.args.tenant_header).map(str::to_owned),
            attempt: attempt(h)?,
            request_id,
        })
    }

    fn class(&self) -> TenantClass {
        if self.tenant.is_some() {
            TenantClass::Named
        } else {
            TenantClass::Default
        }
    }
}

/// The core's decision and what the rest of the path needs of it.
#[expect(
    clippy::large_enum_variant,
    reason = "one per request, on the stack for its life: boxing would add an allocation"
)]
enum Decided {
    NoConfig,
    UnknownLane(Vec<String>),
    Verdict {
        verdict: Verdict,
        lane: usize,
        meters: Arc<Vec<LaneMeter>>,
        enforcing: bool,
        /// A pass (or any request in observe mode) on its way upstream.
        dispatch: Option<Dispatch>,
        /// A queued request's wait.
        wait: Option<(Ticket, oneshot::Receiver<Resolved>)>,
    },
}

/// What a request's head settled, left in its extensions by [`check_head`]
/// for [`handle`]: its record so far and what it asks (the lane and tenant
/// its caller's).
#[derive(Clone)]
struct Checked {
    asked: Asked,
    record: Record,
}

/// The steps that need only a request's head: its ids, its path and
/// method, its attempt header and its caller. The connection runs them
/// before it reads the body or counts the request as served
/// (`conn::HeadCheck`), so a caller refused here costs no body read; the
/// refusal is the whole answer, recorded.
pub(super) async fn check_head(gw: Arc<Gateway>, parts: Parts) -> Result<Parts, Response> {
    let (mut parts, checked) = checked_head(&gw, parts).await?;
    parts.extensions.insert(checked);
    Ok(parts)
}

/// [`head`], with a refusal recorded.
async fn checked_head(gw: &Gateway, mut parts: Parts) -> Result<(Parts, Checked), Response> {
    let mut record = Record::default();
    match head(gw, &mut parts, &mut record).await {
        Ok(asked) => Ok((parts, Checked { asked, record })),
        Err(r) => Err(recorded(gw, &record, r)),
    }
}

/// The head's steps: ids and surface, attempt, caller, its lane, the
/// memory its body may take (held in its extensions for the connection and
/// the handler).
async fn head(gw: &Gateway, parts: &mut Parts, record: &mut Record) -> Result<Asked, Response> {
    let request_id = admissible(gw, parts, record)?;
    let mut asked = Asked::read(&parts.headers, gw, request_id)?;
    let kind = authenticate(gw, parts, &mut asked).await?;
    record.identity = kind.map_or("trusted_header", IdentityKind::as_str);
    record.tenant = asked
        .tenant
        .as_deref()
        .map(|t| respond::prefix(t, 64).to_owned());
    let class = known_lane(gw, &asked)?;
    let hold = hold_body(gw, parts, class)?;
    parts.extensions.insert(hold);
    Ok(asked)
}

/// 503 without a config, 400 for a lane the config does not name, from the
/// rules in force (no lock): answered before the body is read. The core
/// looks the lane up again under its lock, so a config swapped in between
/// is answered there.
/// Returns the share of body memory the lane may use.
fn known_lane(gw: &Gateway, asked: &Asked) -> Result<BodyClass, Response> {
    let rules = gw.rules.load();
    let Some(lanes) = rules.lanes() else {
        return Err(respond::no_config());
    };
    let lane = asked.lane.as_deref();
    match lanes.iter().find(|l| lane == Some(l.name.as_str())) {
        Some(l) if l.top => Ok(BodyClass::Reserved),
        Some(_) => Ok(BodyClass::Shared),
        None => {
            let known: Vec<&str> = lanes.iter().map(|l| l.name.as_str()).collect();
            Err(respond::unknown_lane(&gw.args.lane_header, lane, &known))
        }
    }
}

/// The body's share of `--max-body-memory-bytes`, taken before it is read:
/// its `content-length` (at most `--max-body-bytes`: a longer one is 413 at
/// once), or `--max-body-bytes` while a chunked body is read (none without
/// either: HTTP/1.1 has no body then).
fn hold_body(gw: &Gateway, parts: &Parts, class: BodyClass) -> Result<BodyHold, Response> {
    let limit = gw.args.max_body_bytes;
    let h = &parts.headers;
    let promised = match h.get(header::CONTENT_LENGTH) {
        Some(v) => v.to_str().ok().and_then(|v| v.parse::<u64>().ok()),
        None if h.contains_key(header::TRANSFER_ENCODING) => None,
        None => Some(0),
    };
    let bytes = promised.map_or(limit, |n| usize::try_from(n).unwrap_or(limit).min(limit));
    gw.bodies
        .hold(bytes, class)
        .ok_or_else(|| respond::body_memory_full(gw.args.max_body_memory_bytes))
}

/// Serves one client request whose head passed [`check_head`] (checked
/// here when the connection did not) and leaves its record.
pub(super) async fn handle(State(gw): State<Arc<Gateway>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let checked = match parts.extensions.remove::<Checked>() {
        Some(c) => Ok((parts, c)),
        None => checked_head(&gw, parts).await,
    };
    let (mut parts, Checked { asked, mut record }) = match checked {
        Ok(c) => c,
        Err(r) => return r,
    };
    // The body's memory stays held until the handler is done with it.
    let _body_hold = parts.extensions.remove::<BodyHold>();
    let response = answer(&gw, parts, body, asked, &mut record).await;
    recorded(&gw, &record, response)
}

/// The record of an answer: the request id and decision headers on it, and
/// the decision's log line.
fn recorded(gw: &Gateway, record: &Record, mut response: Response) -> Response {
    let (verdict, reason) = record.stamp(&mut response);
    if verdict == decision::Verdict::Refused && record.lane.is_none() {
        gw.metrics.refused_before_admission(reason);
    }
    decision::log(
        record,
        verdict,
        reason,
        gw.decisions.line(verdict, gw.now()),
    );
    response
}

/// A client's request id in header `name`, checked: 400 when it is not
/// 1 to [`MAX_REQUEST_ID`] visible ASCII characters.
fn checked_id<'a>(
    h: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a HeaderValue>, Response> {
    client_request_id(h, name)
        .map_err(|()| respond::invalid_request_id(name.as_str(), MAX_REQUEST_ID))
}

/// The request ids, checked: `x-request-id` names the answer (the client's,
/// or a new one), and `Idempotency-Key` (else `x-request-id`) is the id
/// retries are counted by, returned; then whether the request is on the
/// forwarded surface.
fn admissible(
    gw: &Gateway,
    parts: &Parts,
    record: &mut Record,
) -> Result<Option<String>, Response> {
    let named = checked_id(&parts.headers, &REQUEST_ID);
    record.request_id = match &named {
        Ok(Some(id)) => (*id).clone(),
        _ => gw.ids.make(),
    };
    let key = checked_id(&parts.headers, &IDEMPOTENCY_KEY)?.or(named?);
    // Visible ASCII: always text.
    let counted = key.and_then(|v| v.to_str().ok()).map(str::to_owned);
    match gw.surface.check(&parts.method, parts.uri.path()) {
        OnSurface::Yes => Ok(counted),
        OnSurface::NoPath => Err(respond::not_on_surface()),
        OnSurface::WrongMethod(allowed) => Err(respond::method_not_allowed(&allowed)),
    }
}

/// The request path after its head: body, decision, wait, forward.
async fn answer(
    gw: &Arc<Gateway>,
    parts: Parts,
    body: Body,
    mut asked: Asked,
    record: &mut Record,
) -> Response {
    let body = match read_body(body, gw.args.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let rules = gw.rules.load().of_lane(asked.lane.as_deref());
    let counted = match &rules.tokenizer {
        Some(t) => {
            gw.tokenizers
                .count(Arc::clone(t), parts.uri.path(), &body)
                .await
        }
        None => None,
    };
    let lane = asked.lane.as_deref();
    let sized = match token_size::prepare(&rules, lane, parts.uri.path(), body, counted) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Some(fleet) = &gw.fleet {
        // Both at once: the request waits for the store at most one call's
        // deadline, not one per call.
        let (lane, id) = (asked.lane.as_deref(), asked.request_id.as_deref());
        tokio::join!(
            fleet.count_sighting(&**gw, lane, id, &mut asked.attempt),
            fleet.take_slots(&**gw, lane, asked.tenant.as_deref()),
        );
    }
    let decided = decide(gw, &asked, sized.size);
    if matches!(decided, Decided::Verdict { .. }) {
        record.lane.clone_from(&asked.lane);
    }
    let mut dispatch = match settle(gw, &asked, decided, record).await {
        Ok(d) => d,
        Err(r) => {
            if let Some(fleet) = &gw.fleet {
                let (lane, id) = (asked.lane.as_deref(), asked.request_id.as_deref());
                fleet.note_deferral(gw, lane, id, &r);
            }
            return r;
        }
    };
    dispatch.meter_usage(sized.metering);
    let out = Outgoing {
        parts,
        body: sized.body,
        class: asked.class(),
        lane: record.lane.as_deref().unwrap_or_default(),
        request_id: &record.request_id,
    };
    forward(&gw.upstream, out, dispatch).await
}

/// Who is calling decides the lane (among its own) and the tenant, unless
/// `--trust-lane-header`; a refusal is answered before the body is read and
/// costs no token. The credential is for the gateway: it never goes
/// upstream.
async fn authenticate(
    gw: &Gateway,
    parts: &mut Parts,
    asked: &mut Asked,
) -> Result<Option<IdentityKind>, Response> {
    match gw.identity.caller(parts, asked.lane.as_deref()).await {
        Ok(Some(caller)) => {
            gw.identity.strip_credentials(&mut parts.headers);
            asked.lane = Some(caller.lane);
            asked.tenant = Some(caller.tenant);
            Ok(Some(caller.kind))
        }
        Ok(None) => Ok(None),
        Err(why) => {
            gw.metrics.auth_refused(why);
            Err(identity::answer(
                why,
                &gw.args.lane_header,
                asked.lane.as_deref(),
            ))
        }
    }
}

/// The body, within `--max-body-bytes` (read before a token is taken for
/// it).
async fn read_body(body: Body, limit: usize) -> Result<Bytes, Response> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(respond::body_too_large(limit)),
        Err(e) => Err(respond::body_unreadable(&e.to_string())),
    }
}

/// The one acquisition of the core's lock on the admit path: the lane
/// looked up, the verdict, a waiter registered for a queued request, and a
/// pass counted in flight with its route and flags.
fn decide(gw: &Arc<Gateway>, asked: &Asked, size: lanes::RequestSize) -> Decided {
    let now = gw.now();
    let mut st = gw.lock();
    let Locked {
        core,
        waiters,
        meters,
        ..
    } = &mut *st;
    let Some(core) = core.as_mut() else {
        return Decided::NoConfig;
    };
    let verdict = asked.lane.as_deref().map(|lane| {
        core.admit_sized(
            &lanes::Request {
                lane,
                tenant: asked.tenant.as_deref(),
                attempt: asked.attempt,
                request_id: asked.request_id.as_deref(),
            },
            size,
            now,
        )
    });
    // The core looks the lane up (once); it names no lane of the config.
    let Some((verdict, lane)) = verdict.and_then(|v| v.lane().map(|l| (v, l))) else {
        return Decided::UnknownLane(core.lane_names().map(str::to_owned).collect());
    };
    let enforcing = core.enforcing();
    let mut wait = None;
    if let Verdict::Queued { ticket, .. } = &verdict {
        if enforcing {
            let (tx, rx) = oneshot::channel();
            waiters.insert(*ticket, tx);
            wait = Some((*ticket, rx));
        } else {
            core.cancel(*ticket);
        }
    }
    let dispatch =
        passing(&verdict, lane, enforcing).map(|pass| gw.dispatch(core, meters, &pass, now));
    let meters = Arc::clone(meters);
    drop(st);
    if wait.is_some() {
        gw.wake.notify_one();
    }
    Decided::Verdict {
        verdict,
        lane,
        meters,
        enforcing,
        dispatch,
        wait,
    }
}

/// What goes upstream at once: a pass, or in observe mode every request
/// (with no deadline of its own).
fn passing(verdict: &Verdict, lane: usize, enforcing: bool) -> Option<lanes::Pass> {
    match verdict {
        Verdict::Pass(p) if enforcing => Some(p.clone()),
        _ if enforcing => None,
        v => Some(lanes::Pass {
            lane,
            attempt: v.attempt(),
            history_turns: None,
            remaining_seconds: f64::INFINITY,
            waited_seconds: 0.0,
            // A pass's tenant slot goes with it (given back when it ends).
            tenant_slot: match v {
                Verdict::Pass(p) => p.tenant_slot.clone(),
                _ => None,
            },
            charge: match v {
                Verdict::Pass(p) => p.charge.clone(),
                _ => None,
            },
        }),
    }
}

/// The decision carried out: an error response, or the pass to forward
/// (after a queued request's wait), each outcome counted.
async fn settle(
    gw: &Arc<Gateway>,
    asked: &Asked,
    decided: Decided,
    record: &mut Record,
) -> Result<Dispatch, Response> {
    let Decided::Verdict {
        verdict,
        lane,
        meters,
        enforcing,
        dispatch,
        wait,
    } = decided
    else {
        return Err(refused_before_admission(gw, asked, decided));
    };
    let name = asked.lane.as_deref().unwrap_or_default();
    let meter = &meters[lane];
    let class = asked.class();
    if !enforcing {
        // Observe: count what enforcing would have done, admit as before.
        if let Some(o) = verdict.outcome() {
            meter.shadow(verdict.attempt(), o);
        }
        meter.request(class, verdict.attempt(), Outcome::Admitted);
        return Ok(dispatch.expect("observe passes everything"));
    }
    match verdict {
        Verdict::Pass(p) => {
            meter.request(class, p.attempt, Outcome::Admitted);
            Ok(dispatch.expect("a pass is dispatched"))
        }
        Verdict::Refuse(r) => {
            meter.refused(class, &r);
            Err(respond::refusal(name, &r))
        }
        Verdict::UnknownLane => Err(respond::lane_gone(name)),
        Verdict::Queued { attempt, .. } => {
            meter.request(class, attempt, Outcome::Queued);
            let wait = wait.expect("a waiter for a queued request");
            let (d, waited) = wait_turn(gw, wait, meter, class, name).await?;
            record.waited_seconds = waited;
            Ok(d)
        }
    }
}

/// 503 without a config, 400 for a lane the config does not have.
fn refused_before_admission(gw: &Gateway, asked: &Asked, decided: Decided) -> Response {
    match decided {
        Decided::UnknownLane(known) => {
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            respond::unknown_lane(&gw.args.lane_header, asked.lane.as_deref(), &known)
        }
        _ => respond::no_config(),
    }
}

/// A queued request waits for its resolution; its place is given back if
/// the client goes away first.
async fn wait_turn(
    gw: &Arc<Gateway>,
    (ticket, rx): (Ticket, oneshot::Receiver<Resolved>),
    meter: &LaneMeter,
    class: TenantClass,
    lane: &str,
) -> Result<(Dispatch, f64), Response> {
    let mut guard = WaitGuard {
        gw,
        ticket: Some(ticket),
    };
    let resolution = rx.await;
    guard.ticket = None;
    match resolution {
        Ok((Resolution::Pass(p), Some(d))) => {
            meter.request(class, p.attempt, Outcome::Admitted);
            meter.waited(p.waited_seconds);
            Ok((d, p.waited_seconds))
        }
        Ok((Resolution::Refuse(r), _)) => {
            meter.refused(class, &r);
            Err(respond::refusal(lane, &r))
        }
        Ok((Resolution::Pass(_), None)) | Err(_) => Err(respond::queue_dropped(lane)),
    }
}

/// Gives a queued ticket back if the client goes away while it waits.
struct WaitGuard<'a> {
    gw: &'a Gateway,
    ticket: Option<Ticket>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket {
            let mut st = self.gw.lock();
            st.waiters.remove(&t);
            if let Some(core) = st.core.as_mut() {
                core.cancel(t);
            }
        }
    }
}
