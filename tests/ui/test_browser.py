"""The web UI in a real browser (Debian's Chromium through Playwright) against one
``cosmicac up``: what a person does, found by role and label as they would find it.

Plain ``def`` tests: Playwright's sync API runs its own event loop, which a trio
test cannot host. The CLI beside the browser runs in this process (CliRunner).

Each test has a fresh browser context (its own pages, its own SharedWorker stream)
that starts signed in as the admin: the module signs in through the form once
(``admin_state``); the first test signs in, and fails to, from a context without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.cli.support import invoke

from .platform import Platform

pytestmark = pytest.mark.slow

#: Long enough for a busy machine; each expect returns as soon as it holds.
WAIT_MS = 30_000


def sign_in(page: Page, platform: Platform) -> None:
    page.goto("/jobs")
    expect(page).to_have_url(re.compile(r"/login\?next=/jobs$"))
    page.get_by_label("Email").fill(platform.email)
    page.get_by_label("Password").fill(platform.password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/jobs$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Jobs")


def open_jobs(page: Page) -> None:
    """The jobs list, in a context that starts signed in (see ``context``)."""
    page.goto("/jobs")
    expect(page.get_by_role("heading", level=1)).to_have_text("Jobs")


@pytest.fixture(scope="module")
def admin_state(browser: Browser, browser_context_args: dict, platform: Platform) -> dict:
    """The admin signed in once, through the form: the cookies every test's context
    starts with, instead of the form's round trips (a redirect to it, the post, a
    scrypt check, the redirect back) in every test. The form itself is tested from
    a context without them (the first test)."""
    signing_in = browser.new_context(**browser_context_args)
    try:
        sign_in(signing_in.new_page(), platform)
        return signing_in.storage_state()
    finally:
        signing_in.close()


@pytest.fixture
def context(new_context: Callable[..., BrowserContext], admin_state: dict) -> BrowserContext:
    """pytest-playwright's context (traced, closed after the test), signed in as the
    admin: its own cookies and pages, the same session on the UI."""
    return new_context(storage_state=admin_state)


def cli(platform: Platform, *args: str) -> str:
    ran = invoke(args, env=platform.env)
    assert ran.returncode == 0, ran.stderr.decode()
    return ran.stdout.decode().strip()


def no_axe_violations(page: Page) -> None:
    results = Axe().run(page)
    assert results.violations_count == 0, results.generate_report()


def test_sign_in_page_and_jobs_list_pass_axe_and_a_wrong_password_says_so(
        new_context: Callable[..., BrowserContext], platform: Platform) -> None:
    page = new_context().new_page()  # signed out, unlike every other test's context
    page.goto("/login")
    no_axe_violations(page)
    page.get_by_label("Email").fill(platform.email)
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("email or password is wrong")
    expect(alert).to_be_focused()
    expect(page.get_by_label("Email")).to_have_value(platform.email)
    sign_in(page, platform)
    no_axe_violations(page)


def test_a_job_created_in_a_terminal_appears_live_and_goes_active_then_leaves(
        page: Page, platform: Platform) -> None:
    open_jobs(page)
    expect(page.get_by_role("status").filter(has_text="Live")).to_be_visible(timeout=WAIT_MS)
    page.evaluate("window.__marker = 'kept'")
    job = cli(platform, "jobs", "create", "--name", "live-row", "--type", "inference",
              "--runtime", "local", "--model", "demo", "--gpus", "1")
    row = page.get_by_role("row", name=re.compile("live-row"))
    expect(row).to_be_visible(timeout=WAIT_MS)
    expect(row.get_by_text("Active", exact=True)).to_be_visible(timeout=WAIT_MS)
    cli(platform, "jobs", "delete", job, "--wait", "--timeout", "60")
    expect(row).to_have_count(0, timeout=WAIT_MS)
    assert page.evaluate("window.__marker") == "kept"  # never reloaded


def test_create_from_the_form_then_the_job_page_goes_active_live_and_duplicate_and_delete(
        page: Page, platform: Platform) -> None:
    open_jobs(page)
    page.get_by_role("link", name="New job").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("New job")
    no_axe_violations(page)
    page.get_by_label("Name", exact=True).fill("from-the-form")
    page.get_by_label("Runtime").select_option("local")
    page.get_by_label("Model").fill("demo")
    page.get_by_label("GPUs per replica").fill("1")
    # Goes to the model server's own command line: the job goes Active only if it took it.
    page.get_by_label("Server arguments").fill("--max-model-len 512")
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("alert")).to_have_count(0)  # else: the form's complaint
    expect(page.get_by_role("heading", level=1)).to_have_text("from-the-form")
    page.evaluate("window.__marker = 'kept'")
    status = page.locator("#job-status")
    expect(status).to_have_text("Active", timeout=WAIT_MS)
    assert page.evaluate("window.__marker") == "kept"  # live, not reloaded
    expect(page.get_by_text("/inference/v1").first).to_be_visible()
    no_axe_violations(page)

    # Duplicate: the form with every field and a new name.
    page.get_by_role("link", name="Duplicate").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Duplicate from-the-form")
    expect(page.get_by_label("Name", exact=True)).to_have_value("from-the-form-copy")
    expect(page.get_by_label("Model")).to_have_value("demo")
    expect(page.get_by_label("GPUs per replica")).to_have_value("1")
    expect(page.get_by_label("Server arguments")).to_have_value("--max-model-len 512")
    page.go_back()

    # Delete asks first: Escape and Cancel keep the job, focus starts on Cancel.
    delete = page.get_by_role("button", name="Delete", exact=True)
    delete.click()
    dialog = page.get_by_role("dialog", name="Delete from-the-form?")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    delete.click()
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    delete.click()
    dialog.get_by_role("button", name="Delete job").click()
    expect(page).to_have_url(re.compile(r"/jobs$"))
    expect(page.get_by_role("row", name=re.compile("from-the-form"))).to_have_count(
        0, timeout=WAIT_MS)


def test_api_keys_secret_once_last_use_after_a_call_and_revoke_confirms(
        page: Page, platform: Platform) -> None:
    import openai

    job = cli(platform, "jobs", "create", "--name", "keyed", "--type", "inference",
              "--runtime", "local", "--model", "demo", "--served-name", "keyed-demo",
              "--gpus", "1", "--wait", "--timeout", "120")
    open_jobs(page)
    page.get_by_role("link", name="API keys").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("API keys")
    page.get_by_label("New key's name").fill("browser-key")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-secret").inner_text()
    no_axe_violations(page)
    row = page.get_by_role("row", name=re.compile("browser-key"))
    expect(row.get_by_role("cell", name="never")).to_be_visible()
    page.reload()
    expect(page.locator("#new-secret")).to_have_count(0)  # shown once
    client = openai.OpenAI(base_url=f"{platform.url}/inference/v1", api_key=secret,
                           max_retries=0, timeout=60)
    client.chat.completions.create(model="keyed-demo", max_tokens=4,
                                   messages=[{"role": "user", "content": "hi"}])
    for _ in range(150):  # the proxy's use reaches app-node's replica (bounded: 30 s)
        page.reload()
        if row.get_by_role("cell", name="never").count() == 0:
            break
        page.wait_for_timeout(200)  # the proxy writes its uses every 0.2 s
    expect(row.get_by_role("cell", name=re.compile(r"ago \("))).to_be_visible()
    row.get_by_role("button", name="Revoke browser-key").click()
    dialog = page.get_by_role("dialog", name="Revoke browser-key?")
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    dialog.get_by_role("button", name="Revoke key").click()
    expect(row.get_by_role("cell", name="Revoked")).to_be_visible()
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="keyed-demo", max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}])
    cli(platform, "jobs", "delete", job)


def test_an_invitation_sent_from_the_team_page_is_accepted_from_the_emails_link(
        page: Page, platform: Platform, browser) -> None:
    import time

    from tests.cli.support import emailed_token

    open_jobs(page)
    page.get_by_role("link", name="Team").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(r"^Team "))
    no_axe_violations(page)
    page.get_by_label("Email to invite").fill("invited@example.com")
    page.get_by_role("button", name="Send invitation").click()
    expect(page.get_by_role("row", name=re.compile("invited@example.com"))).to_be_visible()
    outbox = platform.storage / "app-node" / "outbox"
    deadline = time.monotonic() + 30
    while True:  # the email is written as the invitation is made (bounded: 30 s)
        try:
            token = emailed_token(outbox, "invited@example.com")
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    other = browser.new_context(base_url=platform.url)
    try:
        invited = other.new_page()
        invited.goto(f"/accept?token={token}")
        no_axe_violations(invited)
        invited.get_by_label("Email (the invited address)").fill("invited@example.com")
        invited.get_by_label("Your name").fill("Invited")
        invited.get_by_label("Password").fill("an invited user's password")
        invited.get_by_role("button", name="Create my account and join").click()
        expect(invited.get_by_role("heading", level=1)).to_have_text(re.compile(r"^Team "))
        expect(invited.get_by_text("Your role: Member.")).to_be_visible()
        expect(invited.get_by_role("button", name="Send invitation")).to_have_count(0)
    finally:
        other.close()


def test_the_operators_pages_pass_axe(page: Page, platform: Platform) -> None:
    open_jobs(page)
    for name, heading in (("Racks", "Racks and nodes"), ("Users", "Users"),
                          ("Health", "Control-plane health")):
        page.get_by_role("link", name=name, exact=True).click()
        expect(page.get_by_role("heading", level=1)).to_have_text(heading)
        no_axe_violations(page)


def _pid_of(platform: Platform, service: str) -> int:
    """The pid of ``up``'s ``service`` daemon (its command line names its config)."""
    from pathlib import Path

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(platform.storage / "config" / f"{service}.json").encode() in command:
            return int(entry.name)
    raise AssertionError(f"no {service} process of {platform.storage}")


def _active_job(platform: Platform, name: str) -> str:
    job = cli(platform, "jobs", "create", "--name", name, "--type", "inference",
              "--runtime", "local", "--model", "demo", "--served-name", name, "--gpus", "1",
              "--wait", "--timeout", "90")
    return job


#: Installed in the page: each log line's time from its record's to the DOM, in ms.
_LATENCY_PROBE = """() => {
  window.__logLatency = [];
  new MutationObserver((changes) => {
    for (const change of changes) for (const node of change.addedNodes) {
      const time = node.querySelector && node.querySelector("time");
      if (time) window.__logLatency.push(Date.now() - Date.parse(time.dateTime));
    }
  }).observe(document.getElementById("log-lines"), { childList: true });
}"""

_NUMBERS = "() => [...document.querySelectorAll('#log-lines [data-seq]')]" \
    ".map((li) => Number(li.dataset.seq))"


def _contiguous(page: Page) -> list[int]:
    numbers = page.evaluate(_NUMBERS)
    assert numbers == list(range(1, len(numbers) + 1)), numbers  # none missing or twice
    return numbers


def test_logs_tab_history_then_live_filtered_and_stuck_to_the_bottom_unless_scrolled_up(
        page: Page, platform: Platform) -> None:
    job = _active_job(platform, "logged")
    page.set_viewport_size({"width": 1000, "height": 500})  # the log overflows its view
    page.goto(f"/jobs/{job}")
    page.get_by_role("link", name="Logs").click()
    expect(page).to_have_url(re.compile(rf"/jobs/{job}/logs$"))
    log = page.get_by_role("log")
    expect(log.locator(".log-system").first).to_be_visible(timeout=WAIT_MS)  # history
    expect(log.locator(".log-application").first).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#live")).to_have_text("Live", timeout=WAIT_MS)
    no_axe_violations(page)
    before = len(_contiguous(page))

    # Live: a restart's lines come while the page is open, stuck to the bottom.
    page.evaluate(_LATENCY_PROBE)
    cli(platform, "jobs", "restart", job)
    expect(log.locator("[data-seq]")).not_to_have_count(before, timeout=WAIT_MS)
    latency = page.evaluate("window.__logLatency")
    print(f"log line emit -> DOM: {latency} ms")
    assert latency and min(latency) < 5000, latency  # the figure is printed; 1 s is the aim
    at_bottom = "() => { const v = document.getElementById('log-view');" \
        " return v.scrollHeight - v.scrollTop - v.clientHeight < 8; }"
    page.wait_for_function(at_bottom, timeout=WAIT_MS)

    # Filter: System lines hidden, Application ones kept, and back.
    page.get_by_role("checkbox", name=re.compile("System")).uncheck()
    expect(log.locator(".log-system").first).to_be_hidden()
    expect(log.locator(".log-application").first).to_be_visible()
    page.get_by_role("checkbox", name=re.compile("System")).check()
    expect(log.locator(".log-system").first).to_be_visible()

    # Scrolled up: new lines do not move the view; "Jump to latest" does.
    expect(page.locator("#job-status, .status").first).to_be_visible()
    page.evaluate("document.getElementById('log-view').scrollTop = 0")
    shown = len(_contiguous(page))
    cli(platform, "jobs", "restart", job)
    jump = page.get_by_role("button", name=re.compile("Jump to latest"))
    expect(jump).to_be_visible(timeout=WAIT_MS)
    assert page.evaluate("document.getElementById('log-view').scrollTop") == 0
    jump.click()
    page.wait_for_function(at_bottom, timeout=WAIT_MS)
    expect(jump).to_be_hidden()
    assert len(_contiguous(page)) > shown
    cli(platform, "jobs", "delete", job)


def test_with_app_node_restarted_the_list_catches_up_and_the_logs_tab_resumes_gap_free(
        page: Page, platform: Platform, context: BrowserContext) -> None:
    """One app-node restart (its cost is up's backoff and a daemon's start) for the two
    live pages a person would have open: the jobs list says Reconnecting… then shows
    the job created meanwhile; a job's Logs tab goes on after its last line, nothing
    twice. Neither page is reloaded."""
    import os
    import signal
    import time

    job = _active_job(platform, "logged-across")
    logs = page
    logs.goto(f"/jobs/{job}/logs")
    log = logs.get_by_role("log")
    expect(log.locator(".log-system").first).to_be_visible(timeout=WAIT_MS)  # history
    listing = context.new_page()
    open_jobs(listing)
    tabs = (listing, logs)
    for tab in tabs:
        expect(tab.locator("#live")).to_have_text("Live", timeout=WAIT_MS)
        tab.evaluate("window.__marker = 'kept'")
    os.kill(_pid_of(platform, "app-node"), signal.SIGKILL)
    for tab in tabs:
        expect(tab.locator("#live")).to_have_text("Reconnecting…", timeout=WAIT_MS)
    deadline = time.monotonic() + 60
    while True:  # up restarts app-node; until then the CLI cannot create (bounded: 60 s)
        ran = invoke(("jobs", "create", "--name", "while-away", "--type", "inference",
                      "--runtime", "local", "--model", "demo", "--gpus", "1"),
                     env=platform.env)
        if ran.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ran.returncode == 0, ran.stderr.decode()
    row = listing.get_by_role("row", name=re.compile("while-away"))
    expect(row).to_be_visible(timeout=WAIT_MS)
    for tab in tabs:
        expect(tab.locator("#live")).to_have_text("Live", timeout=WAIT_MS)

    # The logs reconnect after their last line: a restart's lines follow, nothing twice.
    shown = len(_contiguous(logs))
    cli(platform, "jobs", "restart", job)
    expect(log.locator("[data-seq]")).not_to_have_count(shown, timeout=WAIT_MS)
    _contiguous(logs)
    for tab in tabs:
        assert tab.evaluate("window.__marker") == "kept"
    cli(platform, "jobs", "delete", ran.stdout.decode().strip())
    cli(platform, "jobs", "delete", job)


def test_restart_is_sent_once_goes_restarting_starting_active_live_and_a_refusal_says_why(
        page: Page, platform: Platform, context) -> None:
    import json

    job = _active_job(platform, "restarted")
    # Every status the page shows, from the moment each document is parsed: a
    # restart on the local backend (agents forked from a warm parent) can be
    # over in a few hundred ms, before a script run after the load could look.
    page.add_init_script("""document.addEventListener("DOMContentLoaded", () => {
      const status = () => document.getElementById("job-status")?.textContent;
      window.__seen = status() ? [status()] : [];
      new MutationObserver(() => {
        const now = status();
        if (now && window.__seen.at(-1) !== now) window.__seen.push(now);
      }).observe(document.querySelector("main"), { childList: true, subtree: true,
                                                   characterData: true });
    });""")
    page.goto(f"/jobs/{job}")
    status = page.locator("#job-status")
    expect(status).to_have_text("Active", timeout=WAIT_MS)
    page.get_by_role("button", name="Restart", exact=True).dblclick()
    expect(page.get_by_role("heading", level=1)).to_have_text("restarted")
    expect(status).to_have_text("Active", timeout=WAIT_MS)
    seen = page.evaluate("window.__seen")
    assert seen[-1] == "Active" and ("Restarting" in seen or "Starting" in seen), seen
    assert seen.index("Starting" if "Starting" in seen else "Restarting") < len(seen) - 1
    replicas = json.loads(cli(platform, "jobs", "get", job, "-o", "json"))["replicas"]
    assert [r["generation"] for r in replicas] == [1], replicas  # sent once, not twice

    # Refused: the job deleted from a terminal while this page still offers Restart.
    other = context.new_page()
    other.goto(f"/jobs/{job}")
    cli(platform, "jobs", "delete", job)
    other.get_by_role("button", name="Restart", exact=True).click()
    alert = other.get_by_role("main")
    expect(alert).to_contain_text(re.compile(f"(being deleted|no job {job}|does not exist)"))
    assert "{" not in alert.inner_text()  # the API's message, never raw JSON


def test_a_refused_form_marks_its_field_focuses_the_summary_and_keeps_what_was_typed(
        page: Page, platform: Platform) -> None:
    before = cli(platform, "jobs", "list", "-o", "json")

    def submit(name: str, gpus: str, served: str = "") -> None:
        page.goto("/jobs/new")
        page.get_by_label("Name", exact=True).fill(name)
        page.get_by_label("Runtime").select_option("local")
        page.get_by_label("Model").fill("demo")
        if served:
            page.get_by_label("Served name").fill(served)
        page.get_by_label("GPUs per replica").fill(gpus)
        page.get_by_role("button", name="Create").click()

    too_long = "n" * 101  # names are 1-100 characters
    submit(too_long, "1")
    summary = page.get_by_role("alert")
    expect(summary).to_be_focused()
    expect(page.get_by_label("Name", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Name", exact=True)).to_have_value(too_long)
    expect(page.get_by_label("Model")).to_have_value("demo")
    no_axe_violations(page)

    submit("too-big", "99")
    expect(page.get_by_role("alert")).to_be_focused()
    expect(page.get_by_label("GPUs per replica")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("GPUs per replica")).to_have_value("99")

    # A 409 (the served name is taken in the team): its message, on its field.
    job = cli(platform, "jobs", "create", "--name", "taken", "--type", "inference",
              "--runtime", "local", "--model", "demo", "--served-name", "taken-name",
              "--gpus", "1")
    submit("second", "1", served="taken-name")
    expect(page.get_by_role("alert")).to_contain_text("already serves")
    expect(page.get_by_label("Served name")).to_have_attribute("aria-invalid", "true")
    assert "{" not in page.get_by_role("alert").inner_text()  # words, never raw JSON
    after = json.loads(cli(platform, "jobs", "list", "-o", "json"))
    assert {j["name"] for j in after} - {j["name"] for j in json.loads(before)} == {"taken"}
    cli(platform, "jobs", "delete", job)


def test_keyboard_only_from_the_skip_link_to_a_job_and_its_delete_dialog(
        page: Page, platform: Platform) -> None:
    page.goto("/jobs")
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    outline = skip.evaluate("e => getComputedStyle(e).outlineStyle")
    assert outline != "none"  # a visible focus ring
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()

    def tab_to(locator, limit: int = 40) -> None:
        """Tab until ``locator`` has focus (bounded: no trap means we get there). The
        element is found once, so each Tab costs one question of the page; found
        again only if a live update replaced it meanwhile."""
        target = locator.element_handle()
        for _ in range(limit):
            page.keyboard.press("Tab")
            focused = target.evaluate("e => e.isConnected ? e === document.activeElement"
                                      " : null")
            if focused is None:
                target = locator.element_handle()
                focused = target.evaluate("e => e === document.activeElement")
            if focused:
                return
        raise AssertionError(f"Tab never reached {locator}")

    tab_to(page.get_by_role("link", name="New job"))
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text("New job")
    tab_to(page.get_by_label("Name", exact=True))
    page.keyboard.type("by-keyboard")
    tab_to(page.get_by_label("Runtime"))
    page.keyboard.press("ArrowDown")  # the model's default → vllm
    page.get_by_label("Runtime").select_option("local")  # and back to local, as a user would
    tab_to(page.get_by_label("Model"))
    page.keyboard.type("demo")
    tab_to(page.get_by_role("button", name="Create"))
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text("by-keyboard")
    expect(page.locator("#job-status")).to_have_text("Active", timeout=WAIT_MS)
    tab_to(page.get_by_role("button", name="Restart", exact=True))
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text("by-keyboard")
    tab_to(page.get_by_role("link", name="Logs"))
    page.keyboard.press("Enter")
    expect(page.get_by_role("log")).to_be_attached()
    tab_to(page.get_by_role("link", name="Overview"))
    page.keyboard.press("Enter")
    tab_to(page.get_by_role("button", name="Delete", exact=True))
    page.keyboard.press("Enter")
    dialog = page.get_by_role("dialog", name="Delete by-keyboard?")
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    page.keyboard.press("Enter")  # Cancel
    expect(dialog).to_be_hidden()
    tab_to(page.get_by_role("link", name="Duplicate"))
    page.keyboard.press("Enter")
    expect(page.get_by_label("Name", exact=True)).to_have_value("by-keyboard-copy")
    page.go_back()
    tab_to(page.get_by_role("button", name="Delete", exact=True))
    page.keyboard.press("Enter")
    tab_to(dialog.get_by_role("button", name="Delete job"))
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/jobs$"))


def test_a_two_replica_job_shows_each_replicas_live_status_and_actions_only_while_starting(
        page: Page, platform: Platform) -> None:
    job = cli(platform, "jobs", "create", "--name", "two-replicas", "--type", "inference",
              "--runtime", "local", "--model", "demo", "--gpus", "1", "--replicas", "2")
    page.goto(f"/jobs/{job}")
    for index in (0, 1):
        row = page.locator(f"#replica-{index}")
        expect(row.get_by_text("Active", exact=True)).to_be_visible(timeout=WAIT_MS)
        expect(row.get_by_role("button")).to_have_count(0)  # none once Active
    no_axe_violations(page)
    cli(platform, "jobs", "delete", job)


def test_zz_seven_live_tabs_load_at_once_then_ctrl_c_on_up_stops_within_seconds(
        page: Page, platform: Platform, context) -> None:
    """Last in the module (it stops the session's platform). HTTP/1.1 gives a browser
    six connections to one origin: the tabs share one stream (a SharedWorker), so a
    seventh live tab still loads. Then every stream ends when its daemon stops, so
    none holds up's exit."""
    open_jobs(page)
    job = cli(platform, "jobs", "create", "--name", "kept-open", "--type", "inference",
              "--runtime", "local", "--model", "demo", "--gpus", "1")
    tabs = [page]
    for path in ("/jobs", f"/jobs/{job}", "/jobs", f"/jobs/{job}", "/jobs"):
        tab = context.new_page()
        tab.goto(path, wait_until="commit")  # the six load side by side; Live below
        tabs.append(tab)
    for tab in tabs:
        expect(tab.locator("#live")).to_have_text("Live", timeout=WAIT_MS)
    seventh = context.new_page()
    seventh.goto(f"/jobs/{job}", timeout=10_000)  # one stream per page would hang here
    expect(seventh.get_by_role("heading", level=1)).to_have_text("kept-open")
    expect(seventh.locator("#live")).to_have_text("Live", timeout=WAIT_MS)
    tabs.append(seventh)
    other = cli(platform, "jobs", "create", "--name", "seen-by-all", "--type", "inference",
                "--runtime", "local", "--model", "demo", "--served-name", "demo-2",
                "--gpus", "1")
    for tab in tabs:
        if tab.url.endswith("/jobs"):
            expect(tab.get_by_role("row", name=re.compile("seen-by-all"))).to_be_visible(
                timeout=WAIT_MS)
        else:
            expect(tab.locator("#job-status")).to_have_text("Active", timeout=WAIT_MS)
    assert other
    took = platform.interrupt(limit_s=30)
    print(f"up stopped in {took:.2f} s with {len(tabs)} live tabs open")
    assert took < 15, took  # its usual few seconds, not a stream's timeout
