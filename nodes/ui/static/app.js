// The page's own behaviour, small on purpose (the pages work without it).
// Copy buttons: copy their data-copy text and say so where a screen reader hears it.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button.copy[data-copy]");
  if (!button) return;
  try {
    await navigator.clipboard.writeText(button.dataset.copy);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Select and copy";
  }
  button.setAttribute("aria-live", "polite");
});

// Live pages: the page says which topics it shows (#live-topics); the browser's one
// stream (stream-worker.js) sends their fragments, which htmx swaps in by id. The
// stream starts each topic with a snapshot, so after "Reconnecting…" what changed
// meanwhile shows without a reload.
const LIVE_TEXT = {
  live: "Live", reconnecting: "Reconnecting…",
  "signed-out": "Your session ended: reload the page to sign in again.",
};
function liveStatus(state) {
  const live = document.getElementById("live");
  const text = LIVE_TEXT[state] || "";
  if (live && live.textContent !== text) live.textContent = text;
}

function swapFragment(html) {
  const holder = document.getElementById("live-topics");
  htmx.swap({ sourceElement: holder, target: holder, swap: "none", text: html });
}

function startLive() {
  const holder = document.getElementById("live-topics");
  if (!holder) return;
  const topics = JSON.parse(holder.dataset.topics);
  const handlers = {
    fragment: (topic, html) => (topic.startsWith("logs:") ? appendLog(html) : swapFragment(html)),
    done: () => {},
    status: liveStatus,
  };
  if (window.SharedWorker) {
    const worker = new SharedWorker("/static/stream-worker.js", { name: `live-${holder.dataset.user}` });
    const id = crypto.randomUUID();
    worker.port.onmessage = ({ data }) => {
      if (data.state) handlers.status(data.state);
      else if (data.html !== undefined) handlers.fragment(data.topic, data.html);
    };
    worker.port.start();
    const hello = () => worker.port.postMessage({ hello: id, topics });
    if (navigator.locks) {
      // Held while this page lives; the worker waits on it to learn the tab left.
      navigator.locks.request(id, () => { hello(); return new Promise(() => {}); });
    } else {
      hello();
    }
    window.addEventListener("pagehide", () => worker.port.postMessage({ bye: id }));
  } else {
    const stream = new LiveStream({ deliver: handlers.fragment, done: handlers.done,
                                    status: handlers.status });
    stream.want(topics);
  }
}
document.addEventListener("DOMContentLoaded", startLive);

// The Logs tab. Each line carries its number in the job; a batch its stream (a
// restarted wrk-monitor numbers anew). A line already shown is skipped, so a
// stream opened again never shows one twice. The view stays at the bottom unless
// the user scrolled up ("Jump to latest"), and keeps the newest data-cap lines.
const logState = { stream: null, last: 0, unseen: 0 };

function logAtBottom(view) {
  return view.scrollHeight - view.scrollTop - view.clientHeight < 8;
}

function appendLog(html) {
  const view = document.getElementById("log-view");
  const lines = document.getElementById("log-lines");
  if (!view || !lines) return;
  const template = document.createElement("template");
  template.innerHTML = html;
  const batch = template.content.firstElementChild;
  if (!batch || !batch.classList.contains("log-batch")) {
    view.append(template.content); // a notice (the job is gone, no logs to show)
    return;
  }
  const stick = logAtBottom(view);
  if (batch.dataset.stream !== logState.stream) {
    if (logState.stream !== null) {
      const mark = document.createElement("div");
      mark.className = "log-line log-notice";
      mark.textContent = "wrk-monitor restarted: lines between may be missing.";
      lines.append(mark);
    }
    logState.stream = batch.dataset.stream;
    logState.last = 0;
  }
  let added = 0;
  for (const line of [...batch.children]) {
    const seq = Number(line.dataset.seq);
    if (!(seq > logState.last)) continue;
    logState.last = seq;
    lines.append(line);
    added += 1;
  }
  if (added === 0) return;
  document.getElementById("log-empty")?.remove();
  const cap = Number(lines.dataset.cap) || 5000;
  let extra = lines.children.length - cap;
  if (extra > 0) {
    document.getElementById("log-cut").hidden = false;
    while (extra-- > 0) lines.firstElementChild.remove();
  }
  if (stick) {
    view.scrollTop = view.scrollHeight;
  } else {
    logState.unseen += added;
    const jump = document.getElementById("log-jump");
    jump.textContent = `Jump to latest (${logState.unseen} new)`;
    jump.hidden = false;
  }
}

document.addEventListener("click", (event) => {
  if (event.target.id !== "log-jump") return;
  const view = document.getElementById("log-view");
  view.scrollTop = view.scrollHeight;
});
document.addEventListener("scroll", (event) => {
  if (event.target.id !== "log-view" || !logAtBottom(event.target)) return;
  logState.unseen = 0;
  document.getElementById("log-jump").hidden = true;
}, true);

// System and Application lines shown or hidden (the lines stay in the page).
document.addEventListener("change", (event) => {
  const box = event.target;
  if (box.name !== "show" || !box.closest(".log-filter")) return;
  document.getElementById("log-lines").classList.toggle(`hide-${box.value}`, !box.checked);
});

// A form's data-once button is disabled once the form is sent: a second click
// would send the action twice (the page that answers enables it again).
document.addEventListener("submit", (event) => {
  for (const button of event.target.querySelectorAll("button[data-once]")) {
    setTimeout(() => { button.disabled = true; }, 0);
  }
});
