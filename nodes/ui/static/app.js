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

// Live streams (htmx's SSE extension): say when the page's stream is down and
// being reconnected, and when it is live again. The stream starts with a snapshot,
// so what changed meanwhile shows without a reload.
function liveStatus(text) {
  const live = document.getElementById("live");
  if (live && live.textContent !== text) live.textContent = text;
}
document.addEventListener("htmx:sse:before:connection", (event) => {
  if (event.detail && event.detail.connection && event.detail.connection.attempt > 0) {
    liveStatus("Reconnecting…");
  }
});
document.addEventListener("htmx:sse:error", () => liveStatus("Reconnecting…"));
document.addEventListener("htmx:sse:after:connection", () => liveStatus("Live"));

// A form's data-once button is disabled once the form is sent: a second click
// would send the action twice (the page that answers enables it again).
document.addEventListener("submit", (event) => {
  for (const button of event.target.querySelectorAll("button[data-once]")) {
    setTimeout(() => { button.disabled = true; }, 0);
  }
});
