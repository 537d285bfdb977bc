// Live views: an element with data-live-src and data-live-events re-fetches its fragment (rendered and masked by
// the server) whenever its event stream says something changed. No framework, no inline script (the CSP forbids it).
"use strict";
(function () {
  function live(el) {
    const src = el.dataset.liveSrc, events = el.dataset.liveEvents;
    let busy = false, again = false;
    async function refresh() {
      if (busy) { again = true; return; }
      busy = true;
      try {
        const res = await fetch(src, { credentials: "same-origin", headers: { "Accept": "text/html" } });
        if (res.redirected || res.status === 401) { window.location.reload(); return; }
        if (res.ok) {
          const open = Array.from(el.querySelectorAll("details[open]")).map(d => d.closest("[id]") && d.closest("[id]").id);
          const focused = el.contains(document.activeElement) && document.activeElement.tagName !== "BUTTON";
          if (!focused) {
            el.innerHTML = await res.text();
            open.forEach(id => { const box = id && document.getElementById(id); const d = box && box.querySelector("details"); if (d) d.open = true; });
            el.dataset.refreshed = String(Date.now());
          } else { again = true; setTimeout(refresh, 1000); }
        }
      } finally {
        busy = false;
        if (again) { again = false; setTimeout(refresh, 100); }
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
