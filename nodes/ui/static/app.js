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
