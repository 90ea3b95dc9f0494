/* TaskForge dashboard: live queue overview (server-sent events), throughput
 * sparklines kept in this browser, confirmations, and the task page's watch.
 * Plain JavaScript, no dependencies, no build step. */
(function () {
  "use strict";

  var CHART_WINDOW_MS = 5 * 60 * 1000;
  var HISTORY_KEY = "taskforge.throughput.v1";

  // Confirmations: <button data-confirm="Really?"> and <form data-confirm="...">.
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-confirm]");
    if (button && !window.confirm(button.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  });

  // "Select all on this page" checkboxes: <input data-select-all="ids">.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (box.matches && box.matches("input[data-select-all]")) {
      var name = box.getAttribute("data-select-all");
      var form = box.form || document;
      form.querySelectorAll('input[type="checkbox"][name="' + name + '"]').forEach(function (each) {
        each.checked = box.checked;
      });
    }
    if (box.matches && box.matches('input[type="checkbox"]')) {
      updateSelectionCount(box.form);
    }
  });

  function updateSelectionCount(form) {
    if (!form) return;
    var counter = form.querySelector("[data-selection-count]");
    if (!counter) return;
    var n = form.querySelectorAll('input[type="checkbox"][name="ids"]:checked').length;
    counter.textContent = n ? n + " selected" : "";
    form.querySelectorAll("[data-needs-selection]").forEach(function (button) {
      button.disabled = n === 0;
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form").forEach(updateSelectionCount);
    startOverview();
    watchTask();
  });

  // Queue overview ---------------------------------------------------------------

  function loadHistory() {
    try {
      return JSON.parse(window.sessionStorage.getItem(HISTORY_KEY)) || {};
    } catch (e) {
      return {};
    }
  }

  function saveHistory(history) {
    try {
      window.sessionStorage.setItem(HISTORY_KEY, JSON.stringify(history));
    } catch (e) {
      /* private mode or full: the chart just starts over on reload */
    }
  }

  function record(history, snapshot) {
    var at = Date.parse(snapshot.at) || Date.now();
    snapshot.queues.forEach(function (queue) {
      var points = history[queue.name] || (history[queue.name] = []);
      var last = points[points.length - 1];
      if (!last || at > last[0]) {
        points.push([at, queue.throughput_per_second || 0, queue.error_rate || 0]);
      }
      while (points.length && points[0][0] < at - CHART_WINDOW_MS) points.shift();
    });
    saveHistory(history);
  }

  var SVG = "http://www.w3.org/2000/svg";

  function drawSpark(svg, points, now) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var width = 120, height = 28, pad = 2;
    var max = 0;
    points.forEach(function (p) { if (p[1] > max) max = p[1]; });
    var top = max > 0 ? max : 1;
    var x = function (t) { return width - ((now - t) / CHART_WINDOW_MS) * width; };
    var y = function (v) { return height - pad - (v / top) * (height - 2 * pad); };
    var title = document.createElementNS(SVG, "title");
    title.textContent = points.length
      ? "Peak " + max.toFixed(2) + " acks/s over the last " + Math.round(Math.min(CHART_WINDOW_MS, now - points[0][0]) / 1000) + " s"
      : "Collecting samples…";
    svg.appendChild(title);
    if (points.length < 2) return;
    var line = points.map(function (p) { return x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1); });
    var area = document.createElementNS(SVG, "polygon");
    area.setAttribute("class", "area");
    area.setAttribute("points", x(points[0][0]).toFixed(1) + "," + height + " " + line.join(" ") + " " + x(points[points.length - 1][0]).toFixed(1) + "," + height);
    svg.appendChild(area);
    var poly = document.createElementNS(SVG, "polyline");
    poly.setAttribute("class", "line");
    poly.setAttribute("points", line.join(" "));
    svg.appendChild(poly);
  }

  var RAW = {
    pending: function (q) { return q.depth.pending; },
    scheduled: function (q) { return q.depth.scheduled; },
    claimed: function (q) { return q.depth.claimed; },
    executing: function (q) { return q.depth.executing; },
    retry: function (q) { return q.depth.retry; },
    dlq_depth: function (q) { return q.dlq_depth; },
    throughput: function (q) { return q.throughput_per_second; },
    error_rate: function (q) { return q.error_rate; },
    oldest_pending_age: function (q) { return q.oldest_pending_age_seconds; }
  };
  var ZERO_DIM = ["pending", "scheduled", "claimed", "executing", "retry", "dlq_depth"];

  function setText(cell, text) {
    // Cells that hold a link keep it: the text goes into the link.
    var target = cell.querySelector("a") || cell;
    if (target.textContent !== text) target.textContent = text;
  }

  function applyRow(row, queue) {
    row.className = "health-" + queue.health + (queue.paused ? " is-paused" : "");
    row.querySelectorAll("[data-field]").forEach(function (cell) {
      var field = cell.getAttribute("data-field");
      if (field === "health_label") {
        cell.textContent = queue.health_label;
        cell.className = "pill pill-" + queue.health;
        return;
      }
      if (field === "reasons") {
        cell.textContent = queue.text.reasons;
        return;
      }
      var key = field;
      setText(cell, queue.text[key]);
      var raw = RAW[field] ? RAW[field](queue) : null;
      if (ZERO_DIM.indexOf(field) >= 0) cell.classList.toggle("zero", !raw);
      ["lvl-warn", "lvl-crit"].forEach(function (c) { cell.classList.remove(c); });
      var level = queue.levels && queue.levels[field];
      if (level) cell.classList.add("lvl-" + level);
    });
  }

  function applySummary(snapshot) {
    var box = document.getElementById("summary");
    if (!box) return;
    box.className = "summary summary-" + snapshot.summary.health;
    box.querySelector('[data-summary="title"]').textContent = snapshot.summary.title;
    var list = box.querySelector('[data-summary="list"]');
    while (list.firstChild) list.removeChild(list.firstChild);
    snapshot.summary.alerts.forEach(function (alert) {
      var li = document.createElement("li");
      li.className = "lvl-" + alert.level;
      li.textContent = alert.text;
      list.appendChild(li);
    });
    snapshot.summary.unhealthy.forEach(function (item) {
      var li = document.createElement("li");
      li.className = "lvl-" + item.health;
      var a = document.createElement("a");
      a.href = "#q-" + item.name;
      a.textContent = item.name;
      li.appendChild(a);
      li.appendChild(document.createTextNode(" — " + item.why));
      list.appendChild(li);
    });
    var active = document.querySelector('[data-summary="workers-active"]');
    if (active) active.textContent = snapshot.workers.active;
    var stale = document.querySelector('[data-summary="workers-stale"]');
    if (stale) stale.textContent = snapshot.workers.stale;
    var wrap = document.querySelector('[data-summary="workers-stale-wrap"]');
    if (wrap) wrap.hidden = !snapshot.workers.stale;
    var left = document.querySelector('[data-summary="workers-left"]');
    if (left) left.textContent = snapshot.workers.left;
    var leftWrap = document.querySelector('[data-summary="workers-left-wrap"]');
    if (leftWrap) leftWrap.hidden = !snapshot.workers.left;
    var chip = document.getElementById("workers-chip");
    if (chip) chip.classList.toggle("chip-warn", snapshot.workers.stale > 0);
  }

  function startOverview() {
    var table = document.getElementById("queues");
    var dataNode = document.getElementById("snapshot-data");
    if (!dataNode) return;
    var history = loadHistory();
    var live = document.getElementById("live");
    var liveText = document.getElementById("live-text");
    var liveAt = document.getElementById("live-at");

    function apply(snapshot) {
      record(history, snapshot);
      var now = Date.parse(snapshot.at) || Date.now();
      var seen = {};
      var changed = false;
      snapshot.queues.forEach(function (queue) {
        seen[queue.name] = true;
        var row = table && table.querySelector('tr[data-queue="' + window.CSS.escape(queue.name) + '"]');
        if (!row) { changed = true; return; }
        applyRow(row, queue);
        var svg = row.querySelector("svg[data-spark]");
        if (svg) drawSpark(svg, history[queue.name] || [], now);
      });
      if (table) {
        table.querySelectorAll("tr[data-queue]").forEach(function (row) {
          if (!seen[row.getAttribute("data-queue")]) changed = true;
        });
      }
      if (!table && snapshot.queues.length) changed = true;
      var note = document.getElementById("changed-note");
      if (note) note.hidden = !changed;
      if (changed && !table) window.location.reload();
      applySummary(snapshot);
      if (liveAt) {
        liveAt.textContent = snapshot.at_text;
        liveAt.setAttribute("datetime", snapshot.at);
      }
      document.title = (snapshot.summary.health === "crit" ? "▲ " : snapshot.summary.health === "warn" ? "■ " : "") + "Queues · TaskForge";
    }

    apply(JSON.parse(dataNode.textContent));

    // The overview streams with no queue too: the first one created reloads it.
    var url = live ? live.getAttribute("data-stream") : null;
    if (!url || !window.EventSource) return;
    var source = new window.EventSource(url);
    source.addEventListener("snapshot", function (event) {
      live.setAttribute("data-state", "live");
      liveText.textContent = "Live · updated";
      apply(JSON.parse(event.data));
    });
    source.addEventListener("error", function () {
      // EventSource reconnects by itself (the server ends each stream after a
      // few minutes); say so only if it stays down.
      if (source.readyState !== window.EventSource.OPEN) {
        window.setTimeout(function () {
          if (source.readyState !== window.EventSource.OPEN) {
            live.setAttribute("data-state", "down");
            liveText.textContent = "Reconnecting… last update";
          }
        }, 4000);
      }
    });
  }

  // Task page: reload when the task moves (status or heartbeat) ------------------

  function watchTask() {
    var node = document.querySelector("[data-watch-url]");
    if (!node) return;
    var url = node.getAttribute("data-watch-url");
    var version = node.getAttribute("data-watch-version");
    function poll() {
      window.fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (body) {
          if (body && body.version !== version) {
            window.location.reload();
            return;
          }
          window.setTimeout(poll, 3000);
        })
        .catch(function () { window.setTimeout(poll, 6000); });
    }
    window.setTimeout(poll, 3000);
  }
})();
