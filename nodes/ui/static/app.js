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
    fragment: (topic, html) => swapFragment(html),
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

// A form's data-once button is disabled once the form is sent: a second click
// would send the action twice (the page that answers enables it again).
document.addEventListener("submit", (event) => {
  for (const button of event.target.querySelectorAll("button[data-once]")) {
    setTimeout(() => { button.disabled = true; }, 0);
  }
});
