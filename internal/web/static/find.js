// The desktops page's search box, as the user types: hides the desktops
// whose name and description lack any of the words typed, the same test
// the portal applies to ?q= for a browser without script.
"use strict";
(() => {
  const box = document.getElementById("q");
  const found = document.getElementById("found");
  if (!box || !found) {
    return;
  }
  const items = Array.from(document.querySelectorAll("li.desktop"));
  const filter = () => {
    const words = box.value.toLowerCase().split(/\s+/).filter((w) => w !== "");
    let shown = 0;
    for (const li of items) {
      const text = (li.dataset.find || "").toLowerCase();
      li.hidden = !words.every((w) => text.includes(w));
      if (!li.hidden) {
        shown++;
      }
    }
    found.hidden = words.length === 0;
    const q = box.value.trim();
    found.textContent = shown === 0 ? `No desktop matches “${q}”.` : `${shown} of ${items.length} desktops match “${q}”.`;
    // The address keeps the search, so that a reload or coming back
    // shows the same list.
    const url = new URL(window.location.href);
    if (q === "") {
      url.searchParams.delete("q");
    } else {
      url.searchParams.set("q", q);
    }
    window.history.replaceState(null, "", url);
  };
  box.addEventListener("input", filter);
})();
