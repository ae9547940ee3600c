// gpuroster: small progressive enhancements. Every page works without this file.
(function () {
  "use strict";

  // Copy buttons: <button data-copy="ID"> copies the text of element ID.
  function copyText(text, done) {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallback(text, done); });
    } else {
      fallback(text, done);
    }
  }
  function fallback(text, done) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "absolute";
    area.style.left = "-9999px";
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); done(); } catch (e) { /* the text stays selectable */ }
    document.body.removeChild(area);
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) return;
    copyText(source.textContent.trim(), function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1500);
    });
  });

  // Forms with data-confirm="question" (Cancel, Release) ask before they are sent; without
  // JavaScript they are sent as they are. A static file because the pages allow no inline script.
  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute && event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  }, true);

  // Book form: show only the inputs of the chosen mode (devices or "any N devices").
  function syncMode(form) {
    var chosen = form.querySelector('input[name="mode"]:checked');
    if (!chosen) return;
    form.querySelectorAll("[data-mode]").forEach(function (el) {
      el.hidden = el.getAttribute("data-mode") !== chosen.value;
    });
  }
  function syncWhen(form) {
    var chosen = form.querySelector('input[name="when"]:checked');
    var start = form.querySelector('input[name="start"]');
    if (chosen && start) start.disabled = chosen.value === "now";
  }
  function wire(root) {
    root.querySelectorAll("form[data-book]").forEach(function (form) {
      syncMode(form);
      syncWhen(form);
      if (form.dataset.wired) return;
      form.dataset.wired = "1";
      form.addEventListener("change", function (event) {
        syncMode(form);
        syncWhen(form);
        // the host select loads its own device list; every other change re-checks availability
        if (event.target.name !== "host" && window.htmx) window.htmx.trigger(form, "book-check-soon");
      });
      form.addEventListener("input", function (event) {
        var name = event.target.name;
        if ((name === "length" || name === "start") && window.htmx) window.htmx.trigger(form, "book-check-later");
      });
    });
  }
  // Timeline: a grid wider than the screen (a phone) opens scrolled to the "now" line, a
  // quarter of the way in, rather than at midnight with every booking off-screen.
  function showNow(root) {
    root.querySelectorAll(".tl-scroll").forEach(function (scroller) {
      var now = scroller.querySelector(".tl-now");
      if (!now || scroller.scrollWidth <= scroller.clientWidth) return;
      // the device names stay put on the left (sticky): "now" goes a quarter into the rest
      var label = scroller.querySelector(".tl-label");
      var names = label ? label.getBoundingClientRect().width : 0;
      var offset = now.getBoundingClientRect().left - scroller.getBoundingClientRect().left;
      var target = names + (scroller.clientWidth - names) / 4;
      scroller.scrollLeft = Math.max(0, scroller.scrollLeft + offset - target);
    });
  }
  document.addEventListener("DOMContentLoaded", function () { showNow(document); });

  // Polled blocks skip their refresh while the tab is hidden (instead of an htmx trigger
  // filter, which htmx evaluates as script and the Content-Security-Policy forbids).
  document.addEventListener("htmx:beforeRequest", function (event) {
    var source = event.detail && event.detail.elt;
    if (source && source.hasAttribute("data-poll-when-visible") && document.visibilityState !== "visible") {
      event.preventDefault();
    }
  });
  document.addEventListener("DOMContentLoaded", function () { wire(document); });
  document.addEventListener("htmx:afterSettle", function () { wire(document); });
})();
