// nmt-serve page: hover a heatmap cell for its source piece, output piece and weight; hover (or focus) an
// output piece on the left to highlight the source pieces it attends to, by weight. Self-attention maps
// (svg[data-kind=self]: rows are queries, columns the source pieces attended) work alike, and their layer and
// head selectors show one map at a time. The page also works without this script: every cell has an SVG
// <title>, the browser's own tooltip, and every self-attention map is shown.
(function () {
  "use strict";
  var tip = document.getElementById("tip");

  function text(el) { return el ? el.textContent : ""; }

  function showTip(event, html) {
    tip.innerHTML = html;
    tip.hidden = false;
    var x = event.clientX + 14, y = event.clientY + 14;
    var r = tip.getBoundingClientRect();
    if (x + r.width > window.innerWidth - 8) x = event.clientX - r.width - 14;
    if (y + r.height > window.innerHeight - 8) y = event.clientY - r.height - 14;
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }

  function esc(s) {
    return s.replace(/[&<>"]/g, function (c) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]; });
  }

  function setup(svg) {
    var holder = svg.closest(".self-attention") || svg.closest(".model");
    var readout = holder ? holder.querySelector(".readout") : null;
    var isSelf = svg.dataset.kind === "self", rowName = isSelf ? "query" : "output";
    var cells = Array.prototype.slice.call(svg.querySelectorAll("rect.cell"));
    var on = [];
    // the script shows its own tooltip: drop the SVG titles so the browser's does not appear as well
    cells.forEach(function (c) { var t = c.querySelector("title"); if (t) t.remove(); });

    function q(sel) { return svg.querySelector(sel); }
    function mark(el) { if (el) { el.classList.add("on"); on.push(el); } }
    function clear() {
      on.forEach(function (el) { el.classList.remove("on", "row"); el.style.removeProperty("fill-opacity"); });
      on = [];
      svg.classList.remove("row-focus");
      cells.forEach(function (c) { c.classList.remove("row"); });
    }

    cells.forEach(function (cell) {
      cell.addEventListener("mouseenter", function (event) {
        clear();
        var t = cell.dataset.t, s = cell.dataset.s, w = parseFloat(cell.dataset.w);
        mark(cell); mark(q('text.src[data-s="' + s + '"]')); mark(q('text.tgt[data-t="' + t + '"]'));
        mark(q('rect.srcbg[data-s="' + s + '"]')); mark(q('rect.tgtbg[data-t="' + t + '"]'));
        var src = text(q('text.src[data-s="' + s + '"]')), tgt = text(q('text.tgt[data-t="' + t + '"]'));
        var html = (isSelf ? "query <b>" + esc(tgt) + "</b> &middot; attends <b>" + esc(src) + "</b>"
                         : "source <b>" + esc(src) + "</b> &middot; output <b>" + esc(tgt) + "</b>") +
                   " &middot; weight <b>" + w.toFixed(3) + "</b>";
        showTip(event, html);
        if (readout) readout.innerHTML = html;
      });
      cell.addEventListener("mousemove", function (event) { if (!tip.hidden) showTip(event, tip.innerHTML); });
    });

    function focusRow(label, event) {
      clear();
      var t = label.dataset.t;
      svg.classList.add("row-focus");
      mark(label); mark(q('rect.tgtbg[data-t="' + t + '"]'));
      var row = cells.filter(function (c) { return c.dataset.t === t; });
      row.forEach(function (c) {
        c.classList.add("row");
        var bg = q('rect.srcbg[data-s="' + c.dataset.s + '"]');
        if (bg) { bg.style.fillOpacity = Math.min(0.85, parseFloat(c.dataset.w) * 0.85).toFixed(3); on.push(bg); }
      });
      var top = row.slice().sort(function (a, b) { return b.dataset.w - a.dataset.w; }).slice(0, 3);
      var html = rowName + " <b>" + esc(text(label)) + "</b> attends to " + top.map(function (c) {
        return "<b>" + esc(text(q('text.src[data-s="' + c.dataset.s + '"]'))) + "</b> " +
               parseFloat(c.dataset.w).toFixed(3);
      }).join(", ");
      if (readout) readout.innerHTML = html;
      if (event && event.type === "mouseenter") showTip(event, html); else tip.hidden = true;
    }

    svg.querySelectorAll("text.tgt").forEach(function (label) {
      label.addEventListener("mouseenter", function (event) { focusRow(label, event); });
      label.addEventListener("focus", function () { focusRow(label, null); });
      label.addEventListener("blur", clear);
    });
    svg.addEventListener("mouseleave", function () { clear(); tip.hidden = true; });
  }

  document.querySelectorAll("svg.heatmap").forEach(setup);

  // self-attention: show the selectors, and only the map of the chosen layer and head
  document.querySelectorAll("section.self-attention").forEach(function (section) {
    var controls = section.querySelector(".sa-controls");
    var layer = section.querySelector("select.sa-layer"), head = section.querySelector("select.sa-head");
    var maps = Array.prototype.slice.call(section.querySelectorAll("figure.sa-map"));
    if (!controls || !layer || !head || !maps.length) return;
    function show() {
      tip.hidden = true;
      maps.forEach(function (m) {
        m.hidden = !(m.dataset.layer === layer.value && m.dataset.head === head.value);
      });
    }
    controls.hidden = false;
    layer.addEventListener("change", show);
    head.addEventListener("change", show);
    show();
  });

  var form = document.getElementById("form");
  if (form) {
    form.addEventListener("submit", function () {
      var button = document.getElementById("translate");
      // disabled after the submission has picked up its fields (a disabled button's value would be dropped)
      setTimeout(function () { button.disabled = true; button.textContent = "Translating…"; }, 0);
    });
    document.getElementById("text").addEventListener("keydown", function (event) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
    });
  }
})();
