// Live views: an element with data-live-src and data-live-events re-fetches its fragment (rendered and masked by
// the server) whenever its event stream says something changed. No framework, no inline script (the CSP forbids it).
"use strict";
(function () {
  // A field whose value is not the one the page came with: something typed and not sent.
  function edited(f) {
    if (f.type === "hidden" || f.type === "submit" || f.type === "button") return false;
    if (f.type === "checkbox" || f.type === "radio") return f.checked !== f.defaultChecked;
    if (f.tagName === "SELECT") {
      const d = Array.from(f.options).findIndex(o => o.defaultSelected);
      return f.selectedIndex !== (d < 0 ? 0 : d);
    }
    return f.value !== f.defaultValue;
  }
  function live(el) {
    const src = el.dataset.liveSrc, events = el.dataset.liveEvents;
    let busy = false, again = false, timer = null;
    function later(ms) { clearTimeout(timer); timer = setTimeout(refresh, ms); }
    // Someone is writing an answer here (a field has the focus, or holds what they typed): a re-render would
    // throw it away, so it waits (data-held says since when) and is tried again until the answer is sent.
    function holding() {
      const active = document.activeElement;
      if (el.contains(active) && active.tagName !== "BUTTON") return true;
      return Array.from(el.querySelectorAll("input, textarea, select")).some(edited);
    }
    function hold() { el.dataset.held = el.dataset.held || String(Date.now()); later(1000); }
    async function refresh() {
      if (busy) { again = true; return; }
      if (holding()) { hold(); return; }
      busy = true;
      try {
        const res = await fetch(src, { credentials: "same-origin", headers: { "Accept": "text/html" } });
        if (res.redirected || res.status === 401) { window.location.reload(); return; }
        if (res.ok) {
          const text = await res.text();
          if (holding()) { hold(); return; }
          const open = Array.from(el.querySelectorAll("details[open]")).map(d => d.closest("[id]") && d.closest("[id]").id);
          el.innerHTML = text;
          open.forEach(id => { const box = id && document.getElementById(id); const d = box && box.querySelector("details"); if (d) d.open = true; });
          delete el.dataset.held;
          el.dataset.refreshed = String(Date.now());
        }
      } finally {
        busy = false;
        if (again) { again = false; later(100); }
      }
    }
    const stream = new EventSource(events, { withCredentials: true });
    stream.addEventListener("changed", refresh);
    stream.onopen = () => { document.body.dataset.live = "on"; };
    stream.onerror = () => { document.body.dataset.live = "reconnecting"; };
  }
  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-live-src][data-live-events]").forEach(live);
  });
})();
