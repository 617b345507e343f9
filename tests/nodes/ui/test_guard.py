"""Which requests may change something (same-origin only), and the HTTPS test."""

from hypothesis import given
from hypothesis import strategies as st

from nodes.ui.guard import SECURITY_HEADERS, cross_site_reason, request_is_https

HOST = "127.0.0.1:5173"


def test_reads_pass_whatever_their_origin():
    for method in ("GET", "HEAD", "OPTIONS", "get"):
        assert cross_site_reason(method, {"sec-fetch-site": "cross-site"}, HOST) is None


def test_a_post_passes_only_when_the_browser_says_it_came_from_this_site():
    assert cross_site_reason("POST", {"sec-fetch-site": "same-origin"}, HOST) is None
    assert cross_site_reason("POST", {"sec-fetch-site": "none"}, HOST) is None  # typed
    for site in ("cross-site", "same-site"):
        reason = cross_site_reason("POST", {"sec-fetch-site": site}, HOST)
        assert reason is not None and site in reason
    # A browser without Sec-Fetch-Site: its Origin, against the host it addressed.
    assert cross_site_reason("POST", {"origin": "http://127.0.0.1:5173"}, HOST) is None
    assert "evil.example" in cross_site_reason("POST", {"origin": "https://evil.example"},
                                               HOST)
    assert cross_site_reason("POST", {"origin": "null"}, HOST) is not None
    assert "no Origin" in cross_site_reason("POST", {}, HOST)
    # Sec-Fetch-Site wins: a forged same-host Origin does not help a cross-site post.
    assert cross_site_reason("POST", {"sec-fetch-site": "cross-site",
                                      "origin": "http://127.0.0.1:5173"}, HOST) is not None


@given(st.sampled_from(["POST", "PUT", "DELETE", "PATCH"]),
       st.dictionaries(st.sampled_from(["sec-fetch-site", "origin", "referer"]),
                       st.text(max_size=80)),
       st.text(max_size=80))
def test_any_headers_give_a_decision_never_an_error(method, headers, host):
    reason = cross_site_reason(method, headers, host)
    assert reason is None or isinstance(reason, str)


def test_https_is_the_scheme_or_the_proxys_word_for_it():
    assert request_is_https("https", {})
    assert request_is_https("http", {"x-forwarded-proto": "https"})
    assert request_is_https("http", {"x-forwarded-proto": "HTTPS, http"})
    assert not request_is_https("http", {"x-forwarded-proto": "http"})
    assert not request_is_https("http", {})


def test_the_policy_allows_no_inline_script_no_framing_and_no_other_origin():
    headers = dict(SECURITY_HEADERS)
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "unsafe-eval" not in policy and "frame-ancestors 'none'" in policy
    assert headers["x-content-type-options"] == "nosniff"
