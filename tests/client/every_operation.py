"""Calls every operation of Spillway's JSON API through a client generated from its OpenAPI
document by openapi-python-client, and checks each typed answer.

Run by tests/it/openapi.rs, which starts the server, generates the client into a temporary
folder on PYTHONPATH and sets SPILLWAY_URL, SPILLWAY_ADMIN_KEY and SPILLWAY_SERVICE_KEY.
Prints one line per operation called (`called <operation id>`); any failed expectation
raises, so the process exits non-zero.
"""

import io
import os
import time

from spillway_client import AuthenticatedClient, Client
from spillway_client.types import File
from spillway_client.api.audit import list_audit_records
from spillway_client.api.checks import (
    check,
    check_batch,
    forward_auth,
    release_leases,
    renew_leases,
    report_usage,
)
from spillway_client.api.envoy import get_envoy_domain, get_envoy_domain_wiring, put_envoy_domain
from spillway_client.api.alerts import delete_alert, list_alerts, put_alert
from spillway_client.api.history import read_history, read_history_csv
from spillway_client.api.health import healthcheck, healthz, metrics, openapi_document, readyz
from spillway_client.api.identifiers import inspect_identifier, reset_identifier, undo_reset
from spillway_client.api.overrides import add_override, list_overrides, remove_override
from spillway_client.api.policies import (
    delete_policy,
    get_policy,
    list_policies,
    list_policy_versions,
    put_policy,
    suggest_limits,
    what_if,
)
from spillway_client.models import (
    LimitSuggestion,
    WhatIfAnswer,
    WhatIfRequest,
    AlgorithmName,
    OverrideAction,
    QuotaPeriod,
    AlertCondition,
    AlertRuleDocument,
    AlertsDocument,
    AuditPage,
    HistoryDocument,
    LeaseRelease,
    LeaseRenewal,
    LeaseRequest,
    ReportRequest,
    ReportResponse,
    ResetUndone,
    BatchRequest,
    BatchResponse,
    CheckRequest,
    Identifiers,
    CheckResponse,
    EnvoyDescriptor,
    EnvoyDomainFile,
    EnvoyRateLimit,
    Inspection,
    OverrideDocument,
    OverrideList,
    PolicyDocument,
    PolicyList,
    PolicyVersions,
    PolicyView,
    Problem,
    ResetResult,
    RuleDocument,
    Status,
)

URL = os.environ["SPILLWAY_URL"]
admin = AuthenticatedClient(base_url=URL, token=os.environ["SPILLWAY_ADMIN_KEY"])
service = AuthenticatedClient(base_url=URL, token=os.environ["SPILLWAY_SERVICE_KEY"])
anonymous = Client(base_url=URL)


def called(operation, response, status, model=None):
    """Checks one answer's status and typed body, and reports the operation as called."""
    assert response.status_code == status, (
        f"{operation}: {response.status_code} {response.content!r}"
    )
    if model is not None:
        assert isinstance(response.parsed, model), (
            f"{operation}: parsed {type(response.parsed)}, not {model}"
        )
    print(f"called {operation}", flush=True)
    return response.parsed


def ids(**pairs):
    identifiers = Identifiers()
    for k, v in pairs.items():
        identifiers[k] = v
    return identifiers


# Health and the document.
called("healthz", healthz.sync_detailed(client=anonymous), 200, Status)
called("readyz", readyz.sync_detailed(client=anonymous), 200, Status)
called("healthcheck", healthcheck.sync_detailed(client=anonymous), 200)
called("openapi_document", openapi_document.sync_detailed(client=anonymous), 200)

# The checks below count in one fixed minute (a per-minute rule): start clear of the
# minute's turn, or a window that turns midway makes a used-up caller fresh again.
if time.time() % 60 > 40:
    time.sleep(60.5 - time.time() % 60)

# Policies: create, read, list, change (with If-Match), versions.
rule = RuleDocument(name="per-minute", algorithm=AlgorithmName.FIXED_WINDOW, limit=2, window_ms=60_000)
view = called(
    "put_policy",
    put_policy.sync_detailed("client-test", client=admin, body=PolicyDocument(rules=[rule])),
    201,
    PolicyView,
)
assert view.version == 1 and view.rules[0].limit == 2
view = called("get_policy", get_policy.sync_detailed("client-test", client=admin), 200, PolicyView)
assert view.name == "client-test" and view.mode == "enforce"
listed = called("list_policies", list_policies.sync_detailed(client=admin), 200, PolicyList)
assert "client-test" in [p.name for p in listed.policies]
rule.limit = 3
view = put_policy.sync_detailed(
    "client-test", client=admin, body=PolicyDocument(rules=[rule]), if_match='"1"'
).parsed
assert isinstance(view, PolicyView) and view.version == 2, view
versions = called(
    "list_policy_versions",
    list_policy_versions.sync_detailed("client-test", client=admin),
    200,
    PolicyVersions,
)
assert [v.version for v in versions.previous_versions] == [1]
# A refusal parses as a Problem naming its field.
bad = put_policy.sync_detailed(
    "client-test",
    client=admin,
    body=PolicyDocument(rules=[RuleDocument(name="x", algorithm=AlgorithmName.FIXED_WINDOW, limit=0, window_ms=1000)]),
).parsed
assert isinstance(bad, Problem) and bad.field == "rules[0].limit", bad

# Checks: three pass, the fourth is denied (429 with the same typed body).
for expected in (200, 200, 200, 429):
    answer = called(
        "check",
        check.sync_detailed(
            client=service,
            body=CheckRequest(policy="client-test", identifiers=ids(user="ann")),
        ),
        expected,
        CheckResponse,
    )
    assert answer.allowed == (expected == 200) and answer.limit == 3, answer
batch = called(
    "check_batch",
    check_batch.sync_detailed(
        client=service,
        body=BatchRequest(
            checks=[
                CheckRequest(policy="client-test", identifiers=ids(user="bob")),
                CheckRequest(policy="client-test", identifiers=ids(user="ann")),
                CheckRequest(policy="no-such-policy", identifiers=ids(user="ann")),
            ]
        ),
    ),
    200,
    BatchResponse,
)
assert [item.status for item in batch.results] == [200, 429, 404], batch
# Each body typed as what it is: an answer, or a problem.
assert isinstance(batch.results[0].body, CheckResponse) and batch.results[0].body.allowed, batch
assert isinstance(batch.results[1].body, CheckResponse) and not batch.results[1].body.allowed
assert isinstance(batch.results[2].body, Problem), batch.results[2].body
assert batch.results[2].body.type_.endswith("/unknown-policy"), batch.results[2].body
answer = called(
    "forward_auth",
    forward_auth.sync_detailed(client=service, policy="client-test", x_forwarded_for="198.51.100.9"),
    200,
    CheckResponse,
)
assert answer.allowed and answer.remaining == 2, answer
# The checks show in the metrics.
r = metrics.sync_detailed(client=anonymous)
assert b"spillway_checks_total" in r.content, r.content[:300]
called("metrics", r, 200)
# A service key may not change policies: a typed 403.
refused = put_policy.sync_detailed("client-test", client=service, body=PolicyDocument(rules=[rule]))
assert refused.status_code == 403 and isinstance(refused.parsed, Problem), refused

# The identifier: inspect (used up), reset (with a reason), inspect again (fresh).
seen = called(
    "inspect_identifier",
    inspect_identifier.sync_detailed("user", "ann", client=admin),
    200,
    Inspection,
)
ours = [p for p in seen.policies if p.policy == "client-test"][0]
assert ours.rules[0].remaining == 0 and ours.rules[0].retry_after_ms > 0, ours
done = called(
    "reset_identifier",
    reset_identifier.sync_detailed(
        "user", "ann", client=admin, policy="client-test", reason="generated client test"
    ),
    200,
    ResetResult,
)
assert done.policies == ["client-test"] and done.deleted_keys >= 1, done
seen = inspect_identifier.sync_detailed("user", "ann", client=admin).parsed
ours = [p for p in seen.policies if p.policy == "client-test"][0]
assert ours.rules[0].remaining == 3, ours
# Reset by mistake: the undo puts the counters back (once), then the reset again.
undone = called("undo_reset", undo_reset.sync_detailed(done.undo.token, client=admin), 200, ResetUndone)
assert undone.identifiers == ["user=ann"] and undone.restored_keys == done.deleted_keys, undone
seen = inspect_identifier.sync_detailed("user", "ann", client=admin).parsed
ours = [p for p in seen.policies if p.policy == "client-test"][0]
assert ours.rules[0].remaining == 0, ours
again = undo_reset.sync_detailed(done.undo.token, client=admin)
assert again.status_code == 404 and isinstance(again.parsed, Problem), again
reset_identifier.sync_detailed("user", "ann", client=admin, policy="client-test", reason="generated client test")

# Overrides: add, list, remove.
added = called(
    "add_override",
    add_override.sync_detailed(
        "client-test",
        client=admin,
        body=OverrideDocument(match="user=vip", action=OverrideAction.UNLIMITED, reason="a partner"),
    ),
    201,
    OverrideList,
)
assert len(added.overrides) == 1 and added.overrides[0].match == "user=vip", added
listed = called("list_overrides", list_overrides.sync_detailed("client-test", client=admin), 200, OverrideList)
assert len(listed.overrides) == 1
removed = called(
    "remove_override",
    remove_override.sync_detailed("client-test", 0, client=admin),
    200,
    OverrideList,
)
assert removed.overrides == [], removed

# What if: the policy in force replayed over its own record changes nothing.
replayed = called(
    "what_if",
    what_if.sync_detailed("client-test", client=admin, body=WhatIfRequest(last_ms=3600000)),
    200,
    WhatIfAnswer,
)
assert replayed.newly_denied == 0 and replayed.newly_allowed == 0 and replayed.complete, replayed
suggested = called(
    "suggest_limits",
    suggest_limits.sync_detailed("client-test", client=admin, rule="per-minute"),
    200,
    LimitSuggestion,
)
assert suggested.rule == "per-minute" and suggested.window_ms == 60000, suggested

# The audit log holds the reset with its reason.
page = called(
    "list_audit_records",
    list_audit_records.sync_detailed(client=admin, action="identifier.reset"),
    200,
    AuditPage,
)
assert page.entries and page.entries[0].reason == "generated client test", page

# The policy's history over the last hour, per minute (what the instance flushed so far).
history = called(
    "read_history",
    read_history.sync_detailed(client=admin, policy="client-test", range_="1h", top=5),
    200,
    HistoryDocument,
)
assert history.policy == "client-test" and history.step == "minute", history
assert len(history.points) == 60 and history.points[-1].t_ms > history.points[0].t_ms, history
# The series as CSV: a declared media type, so the client does not parse it as JSON.
csv = called(
    "read_history_csv",
    read_history_csv.sync_detailed(client=admin, policy="client-test", range_="1h"),
    200,
    str,
)
assert csv.startswith("time,allowed,denied,shadow_denied,degraded\n"), csv.content[:80]
bad = read_history.sync_detailed(client=admin, range_="2d")
assert bad.status_code == 400 and isinstance(bad.parsed, Problem), bad
# Asked of the JSON operation, CSV is a typed 400 pointing at the CSV one (never CSV
# handed to a JSON parser).
asked_csv = read_history.sync_detailed(client=admin, policy="client-test", range_="1h", format_="csv")
assert asked_csv.status_code == 400 and isinstance(asked_csv.parsed, Problem), asked_csv
assert asked_csv.parsed.field == "format" and "/api/v1/history/csv" in asked_csv.parsed.detail, asked_csv.parsed

# An alert rule on the policy's denials: stored (its secret never shown again), listed,
# removed.
rule = called(
    "put_alert",
    put_alert.sync_detailed(
        "client-alert",
        client=admin,
        body=AlertRuleDocument(
            condition=AlertCondition(kind="policy_denials", policy="client-test", per_second=10.0, for_seconds=60),
            webhook_url="https://hooks.example.com/spillway",
            secret="a secret of sixteen or more",
        ),
    ),
    200,
    AlertRuleDocument,
)
assert rule.secret == "(set)" and rule.condition.kind == "policy_denials", rule
alerts = called("list_alerts", list_alerts.sync_detailed(client=admin), 200, AlertsDocument)
assert [r.name for r in alerts.rules] == ["client-alert"], alerts
called("delete_alert", delete_alert.sync_detailed("client-alert", client=admin), 204)
bad = put_alert.sync_detailed(
    "client-alert",
    client=admin,
    body=AlertRuleDocument(
        condition=AlertCondition(kind="policy_denials", policy="client-test", per_second=10.0, for_seconds=60),
        webhook_url="ftp://nope",
        secret="a secret of sixteen or more",
    ),
)
assert bad.status_code == 400 and isinstance(bad.parsed, Problem) and bad.parsed.detail.startswith("webhook_url"), bad

# A concurrency rule and a monthly quota: a check holds a lease, renewed then released;
# usage reported afterwards moves the quota's remaining exactly.
jobs = [
    RuleDocument(name="running", algorithm=AlgorithmName.CONCURRENCY, limit=1, lease_ms=60_000),
    RuleDocument(name="monthly", algorithm=AlgorithmName.QUOTA, limit=100, period=QuotaPeriod.MONTH, time_zone="Europe/Berlin"),
]
called(
    "put_policy",
    put_policy.sync_detailed("client-jobs", client=admin, body=PolicyDocument(rules=jobs)),
    201,
    PolicyView,
)
held = check.sync_detailed(client=service, body=CheckRequest(policy="client-jobs", identifiers=ids(team="a"))).parsed
lease = held.results[0].lease
assert held.allowed and lease, held
renewed = called("renew_leases", renew_leases.sync_detailed(client=service, body=LeaseRequest(lease=lease)), 200, LeaseRenewal)
assert renewed.results[0].renewed and renewed.results[0].expires_in_ms > 59_000, renewed
released = called(
    "release_leases", release_leases.sync_detailed(client=service, body=LeaseRequest(leases=[lease, lease])), 200, LeaseRelease
)
assert [r.released for r in released.results] == [True, False], released
usage = Identifiers()
usage["team"] = "a"
reported = called(
    "report_usage",
    report_usage.sync_detailed(client=service, body=ReportRequest(policy="client-jobs", identifiers=usage, cost=40)),
    200,
    ReportResponse,
)
assert [r.remaining for r in reported.results] == [1, 59], reported
called("delete_policy", delete_policy.sync_detailed("client-jobs", client=admin), 204)

# Delete; reading it then is a typed 404.
called("delete_policy", delete_policy.sync_detailed("client-test", client=admin), 204)
gone = get_policy.sync_detailed("client-test", client=admin)
assert gone.status_code == 404 and isinstance(gone.parsed, Problem), gone

# An Envoy domain in envoyproxy/ratelimit's format, as JSON: loaded, then read back.
file = EnvoyDomainFile(
    domain="edge",
    descriptors=[
        EnvoyDescriptor(
            key="remote_address",
            rate_limit=EnvoyRateLimit(unit="minute", requests_per_unit=10, name="per-ip"),
        )
    ],
)
loaded = called(
    "put_envoy_domain",
    put_envoy_domain.sync_detailed("edge", client=admin, body=file, failure_mode="closed"),
    201,
    EnvoyDomainFile,
)
assert loaded.descriptors[0].rate_limit.requests_per_unit == 10, loaded
read = called("get_envoy_domain", get_envoy_domain.sync_detailed("edge", client=admin), 200, EnvoyDomainFile)
assert read.domain == "edge" and read.descriptors[0].key == "remote_address", read
# The same file in YAML, as uploaded: the generated client sends a file's bytes.
yaml_file = b"domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 20, name: per-ip}\n"
from_yaml = called(
    "put_envoy_domain",
    put_envoy_domain.sync_detailed(
        "edge", client=admin, body=File(payload=io.BytesIO(yaml_file), file_name="edge.yaml")
    ),
    200,
    EnvoyDomainFile,
)
assert from_yaml.descriptors[0].rate_limit.requests_per_unit == 20, from_yaml
wiring = called("get_envoy_domain_wiring", get_envoy_domain_wiring.sync_detailed("edge", client=admin), 200)
assert "remote_address: {}" in wiring[1].yaml, wiring

