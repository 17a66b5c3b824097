"""The declared endpoints' figure: the spec's own one-difference claims, grouped by endpoint."""

from explorl.report.endpoints import draw_endpoints, endpoint_panels


def _claim(cid, label, est, low, high, verdict, mde=0.1):
    iv = {"estimate": est, "low": low, "high": high, "power": {"mde": mde} if mde else None}
    return {"id": cid, "conditions": [{"label": label, "interval": iv, "verdict": verdict,
                                       "null": 0.0}]}


CLAIMS = [
    _claim("P1-a", "a − real-grpo, test pass@1", 0.01, -0.2, 0.22, "not shown"),
    _claim("P1-b", "b − real-grpo, test pass@1", -0.05, -0.3, 0.2, "not shown", mde=None),
    _claim("M-a", "a − real-grpo, test pass@16 − pass@1 (coverage margin)", -0.03, -0.05,
           -0.01, "opposite"),
    _claim("M-b", "b − real-grpo, test pass@16 − pass@1 (coverage margin)", 0.15, 0.04, 0.26,
           "shown"),
    # a library check (not the spec's own), and a claim of two conditions: left out
    _claim("N1", "GRPO − base, test pass@1", 0.03, -0.1, 0.2, "not shown"),
    {"id": "3a", "conditions": [
        {"label": "a − GRPO, H final", "interval": {"estimate": 0, "low": -1, "high": 1}},
        {"label": "b − GRPO, H final", "interval": {"estimate": 0, "low": -1, "high": 1}}]},
]


def test_panels_group_the_spec_s_own_claims_by_endpoint():
    panels = endpoint_panels(CLAIMS, {"P1-a", "P1-b", "M-a", "M-b", "3a"})
    assert list(panels) == ["test pass@1|real-grpo",
                            "test pass@16 − pass@1 (coverage margin)|real-grpo"]
    margin = panels["test pass@16 − pass@1 (coverage margin)|real-grpo"]
    assert [(r["arm"], r["estimate"], r["verdict"]) for r in margin] == [
        ("a", -0.03, "opposite"), ("b", 0.15, "shown")]
    assert panels["test pass@1|real-grpo"][1]["mde"] is None  # no power: no MDE band
    assert "GRPO" not in str(panels)  # N1 parses, but the spec did not declare it


def test_the_figure_is_drawn_only_when_there_are_endpoints(tmp_path):
    assert draw_endpoints(CLAIMS, {"M-a", "M-b"}, tmp_path) == "endpoints.png"
    assert (tmp_path / "endpoints.png").stat().st_size > 5_000
    assert draw_endpoints(CLAIMS, set(), tmp_path / "none") is None
    assert not (tmp_path / "none").exists()
