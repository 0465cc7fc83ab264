//! A lane's tenants in the report (lanes whose scenario has `tenants`):
//! each tenant's originals and how they ended.

use serde::Serialize;

use super::engine::TenantRun;

/// One tenant of a lane over the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantReport {
    /// The tenant's name.
    pub name: String,
    /// Original requests.
    pub offered: u64,
    /// Answered within the lane's deadline.
    pub within_deadline: u64,
    /// Of the requests that ended (answered or lost), the share answered
    /// within the deadline, in percent (3 decimals; None before any ended).
    pub within_deadline_percent: Option<f64>,
    /// Answered after the deadline.
    pub late: u64,
    /// Lost: rejected, expired, failed or deferred past the deadline.
    pub lost: u64,
}

/// The report of one tenant's run.
pub fn tenant_report(t: &TenantRun) -> TenantReport {
    let ended = t.within_deadline + t.late + t.lost;
    TenantReport {
        name: t.name.clone(),
        offered: t.offered,
        within_deadline: t.within_deadline,
        within_deadline_percent: (ended > 0)
            .then(|| (t.within_deadline as f64 / ended as f64 * 100_000.0).round() / 1000.0),
        late: t.late,
        lost: t.lost,
    }
}

/// The tenant's line under its lane's table.
pub fn tenant_line(lane: &str, t: &TenantReport) -> String {
    let pct = t
        .within_deadline_percent
        .map_or_else(|| "-".to_owned(), |p| format!("{p:.3}%"));
    format!(
        "tenant {lane}/{}: offered {}, within deadline {pct} ({}), late {}, lost {}",
        t.name, t.offered, t.within_deadline, t.late, t.lost
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_share_in_time_is_of_the_requests_that_ended() {
        let r = tenant_report(&TenantRun {
            name: "bulk".into(),
            offered: 10,
            within_deadline: 6,
            late: 1,
            lost: 1,
        });
        assert_eq!(r.within_deadline_percent, Some(75.0));
        assert_eq!(
            tenant_line("chat", &r),
            "tenant chat/bulk: offered 10, within deadline 75.000% (6), late 1, lost 1"
        );
        let none = tenant_report(&TenantRun::default());
        assert_eq!(none.within_deadline_percent, None);
        assert!(tenant_line("chat", &none).contains("within deadline - (0)"));
    }
}
