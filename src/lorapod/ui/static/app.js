// lorapod ui: live charts (uPlot) and fragments over server-sent events, and the three buttons.
// Text from run folders reaches the page only as server-escaped HTML or through textContent.
"use strict";
(function () {
  const token = document.querySelector('meta[name="lorapod-token"]').content;
  window.lorapod = { rows: 0, lastStep: null, charts: {}, statusEvents: 0 };

  // ---------------------------------------------------------------- live fragments
  function follow(url, handlers) {
    const es = new EventSource(url);
    for (const [name, fn] of Object.entries(handlers)) {
      es.addEventListener(name, (ev) => fn(JSON.parse(ev.data)));
    }
    return es;
  }
  const runs = document.getElementById("runs");
  if (runs) follow(runs.dataset.stream, { runs: (d) => { runs.innerHTML = d.html; } });

  // ---------------------------------------------------------------- buttons
  const out = document.getElementById("action-out");
  // What the run's status (re-rendered every few seconds) says each button needs: a job still
  // running ("active") or an instance that may still bill ("live"). A page left open while the job
  // ends must not keep offering to destroy an instance that is gone.
  function refreshButtons() {
    const s = document.querySelector("#status .status");
    if (!s) return;
    for (const b of document.querySelectorAll("button[data-needs]")) {
      const ok = s.dataset[b.dataset.needs] === "1";
      b.disabled = !ok;
      if (b.dataset.needs === "live") b.hidden = !ok;
    }
  }
  window.lorapod.refreshButtons = refreshButtons;
  for (const b of document.querySelectorAll("button[data-action]")) {
    b.addEventListener("click", async () => {
      if (!window.confirm(b.dataset.confirm)) return;
      b.disabled = true;
      out.textContent = b.textContent + "...";
      try {
        const r = await fetch(b.dataset.action, { method: "POST", headers: { "X-Lorapod-Token": token } });
        const body = await r.json();
        out.textContent = (body.lines || []).join("\n") || (r.ok ? "done" : "failed");
        out.dataset.ok = String(body.ok);
      } catch (e) {
        out.textContent = "failed: " + e;
        out.dataset.ok = "false";
      } finally {
        b.disabled = false;
        refreshButtons();  // as the status says now, not simply enabled again
      }
    });
  }

  // Axis numbers: uPlot rounds to a few decimals, so a learning rate of 1e-4 would read "0".
  function tick(v) {
    if (v === 0 || v == null) return v === 0 ? "0" : "";
    const a = Math.abs(v);
    return a < 1e-2 || a >= 1e5 ? v.toExponential(1) : String(+v.toPrecision(3));
  }
  const yAxis = { size: 64, values: (u, vals) => vals.map(tick) };

  // ---------------------------------------------------------------- compare: one curve per run
  for (const el of document.querySelectorAll(".chart[data-runs]")) {
    const jobs = el.dataset.runs.split(",").filter(Boolean);
    const keys = el.dataset.key.split(",");
    Promise.all(jobs.map((j) => fetch(document.body.dataset.root + "/runs/" + encodeURIComponent(j) + "/metrics").then((r) => r.json()))).then((all) => {
      const tables = [], labels = [];
      all.forEach((m, i) => {
        const k = keys.find((k) => m.series[k]);
        if (k) { tables.push([m.series[k].x, m.series[k].y]); labels.push(jobs[i]); }
      });
      if (!tables.length) { el.textContent = el.dataset.title + ": nothing logged yet"; return; }
      const opts = {
        title: el.dataset.title, width: Math.max(320, el.clientWidth - 12), height: 260, scales: { x: { time: false } },
        series: [{ label: "step" }, ...labels.map((l, i) => ({ label: l, stroke: ["#2f6fde", "#e8590c", "#2e7d32", "#8e24aa",
                 "#00838f", "#c62828", "#6d4c41", "#546e7a"][i % 8], width: 1.5, spanGaps: true }))],
        axes: [{ label: "step" }, yAxis],
      };
      window.lorapod.charts[el.id] = { u: new uPlot(opts, uPlot.join(tables), el) };
    });
  }

  // ---------------------------------------------------------------- ticked runs survive the table's refresh
  const ticked = new Set();
  document.addEventListener("change", (ev) => {
    const t = ev.target;
    if (t.name === "job" && t.type === "checkbox") { if (t.checked) ticked.add(t.value); else ticked.delete(t.value); }
  });
  if (runs) {
    new MutationObserver(() => {
      for (const box of runs.querySelectorAll("input[name=job]")) box.checked = ticked.has(box.value);
    }).observe(runs, { childList: true });
  }

  // ---------------------------------------------------------------- charts
  const status = document.getElementById("status");
  if (!status) return;
  const COLORS = ["#2f6fde", "#e8590c", "#2e7d32", "#8e24aa"];
  const charts = {};
  let maxPoints = 1500;

  function makeChart(el) {
    const keys = el.dataset.keys.split(",");
    const c = { el, keys, raw: {}, u: null };
    for (const k of keys) c.raw[k] = [[], []];
    charts[el.id] = c;
    window.lorapod.charts[el.id.replace("chart-", "")] = c;
    return c;
  }
  for (const el of document.querySelectorAll(".chart")) makeChart(el);

  function draw(c) {
    const present = c.keys.filter((k) => c.raw[k][0].length);
    if (!present.length) {
      if (!c.u) c.el.textContent = c.el.dataset.title + ": nothing logged yet";
      return;
    }
    let data = uPlot.join(present.map((k) => c.raw[k]));
    // the quality chart marks the autopilot's pick: one large point on the score curve at its step
    const pick = c.el.dataset.pick ? Number(c.el.dataset.pick) : null;
    const at = pick !== null && c.raw.quality_score ? c.raw.quality_score[0].indexOf(pick) : -1;
    if (at >= 0) data = [...data, data[0].map((x) => (x === pick ? c.raw.quality_score[1][at] : null))];
    const sig = present.join(",") + (at >= 0 ? ",pick" : "");
    if (!c.u || c.sig !== sig) {
      if (c.u) c.u.destroy();
      c.el.textContent = "";
      c.sig = sig;
      const opts = {
        title: c.el.dataset.title, width: Math.max(320, c.el.clientWidth - 12), height: 220,
        scales: { x: { time: false } },
        series: [{ label: "step" }, ...present.map((k, i) => ({ label: k, stroke: COLORS[i % 4], width: 1.5, spanGaps: true,
                  points: { show: k.startsWith("val") || k.startsWith("fixed") || k.startsWith("quality") } })),
                 ...(at >= 0 ? [{ label: "pick", stroke: "#c62828", width: 0, points: { show: true, size: 14, fill: "#c62828" } }] : [])],
        axes: [{ label: "step" }, yAxis],
      };
      c.u = new uPlot(opts, data, c.el);
    } else {
      c.u.setData(data);
    }
  }

  function addRows(rows) {
    for (const r of rows) {
      if (typeof r.step !== "number") continue;
      if (r.step_time_s && r.it_per_s === undefined && r.tokens_per_s === undefined) r.it_per_s = 1 / r.step_time_s;
      for (const c of Object.values(charts)) {
        for (const k of c.keys) {
          const v = r[k], xs = c.raw[k][0];
          // steps only go forward: a line read live from the instance and again from the pull is drawn once
          if (typeof v === "number" && isFinite(v) && !(xs.length && r.step <= xs[xs.length - 1])) {
            xs.push(r.step); c.raw[k][1].push(v);
          }
        }
      }
      if (typeof r.loss === "number" && !(window.lorapod.lastStep >= r.step)) window.lorapod.lastStep = r.step;
      window.lorapod.rows += 1;
    }
  }

  function load() {
    return fetch(status.dataset.metrics).then((r) => r.json()).then((m) => {
      maxPoints = m.max_points;
      for (const c of Object.values(charts)) {
        for (const k of c.keys) c.raw[k] = m.series[k] ? [m.series[k].x, m.series[k].y] : [[], []];
        draw(c);
      }
      window.lorapod.rows = m.rows;
      const loss = m.series.loss;
      if (loss) window.lorapod.lastStep = loss.x[loss.x.length - 1];
      const note = document.getElementById("chart-note");
      if (note) {
        // what was read, never more: a sampled file's line count is not the run's
        const mb = (m.bytes / 1048576).toFixed(1);
        note.textContent = m.sampled
          ? "metrics.jsonl is " + mb + " MB: its last " + (m.tail_bytes / 1048576).toFixed(0) + " MB read in full and stretches of the rest sampled (" + m.rows + " lines read), up to step " + m.last_step + "; at most " + maxPoints + " points per series"
          : m.rows > maxPoints ? m.rows + " metrics lines, drawn as at most " + maxPoints + " points per series (the lowest and highest of each stretch kept)" : "";
      }
      return m.offset;
    });
  }

  load().then((offset) => {
    let pending = false;
    follow(status.dataset.stream + "?offset=" + offset, {
      metrics: (d) => {
        addRows(d.rows);
        const big = Object.values(charts).some((c) => c.keys.some((k) => c.raw[k][0].length > 2 * maxPoints));
        if (big && !pending) { pending = true; load().finally(() => { pending = false; }); return; }
        for (const c of Object.values(charts)) draw(c);
      },
      status: (d) => { status.innerHTML = d.html; window.lorapod.statusEvents += 1; window.lorapod.refreshButtons(); },
    });
  });
})();
