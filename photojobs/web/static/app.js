// photojobs console: plain script (no build step), same-origin fetches with the session cookie, live via
// SSE. Hash routes: #/ (jobs, workers, events), #/jobs/ID (a job: times, parameters, failures, items),
// #/lanes (queue depth, throughput, workers, pause/resume).
"use strict";
(function () {
  const $ = (sel) => document.querySelector(sel);
  const DONE = ["succeeded", "failed", "cancelled", "skipped"];
  const SVG = "http://www.w3.org/2000/svg";
  const jobs = new Map();          // the jobs page shown: job id -> STATUS
  const list = { state: "", q: "", cursors: [null], page: 0, next: null };
  const detail = { id: null, st: null, items: { state: "", lane: "", cursors: [null], page: 0, next: null } };
  let source = null;
  let cursor = 0;
  const dirty = new Set();
  let refreshTimer = null;
  let lanesDirty = false;

  async function api(method, path, body) {
    const opts = { method, credentials: "same-origin", headers: {} };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const res = await fetch(path, opts);
    let data = null;
    const text = await res.text();
    if (text) { try { data = JSON.parse(text); } catch (e) { data = { message: text }; } }
    if (res.status === 401) { showLogin(); }
    if (!res.ok) { const err = new Error((data && data.message) || res.statusText); err.status = res.status; err.data = data; throw err; }
    return data;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") node.className = v;
      else if (k === "onclick") node.addEventListener("click", v);
      else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "style" || k === "scope") node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined || c === "") continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  // -- times: relative, with the absolute time and zone on hover --------------------------------------
  const ZONE = (Intl.DateTimeFormat().resolvedOptions().timeZone) || "local time";
  function absolute(epoch) {
    const d = new Date(epoch * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    const off = -d.getTimezoneOffset();
    const sign = off >= 0 ? "+" : "-";
    const zone = `UTC${sign}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())} ${zone} (${ZONE})`;
  }
  function duration(seconds) {
    if (seconds == null) return "–";
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }
  function relative(epoch) {
    const s = Math.round(Date.now() / 1000 - epoch);
    if (Math.abs(s) < 5) return "just now";
    const a = Math.abs(s);
    const text = a < 60 ? `${a} s` : a < 3600 ? `${Math.floor(a / 60)} min` : a < 86400 ? `${Math.floor(a / 3600)} h` : `${Math.floor(a / 86400)} d`;
    return s >= 0 ? `${text} ago` : `in ${text}`;
  }
  function timeEl(epoch) {
    if (epoch == null) return el("span", {}, "–");
    return el("time", { dateTime: new Date(epoch * 1000).toISOString(), title: absolute(epoch), "data-epoch": String(epoch) }, relative(epoch));
  }
  function tickTimes() {
    for (const t of document.querySelectorAll("time[data-epoch]")) t.textContent = relative(Number(t.dataset.epoch));
  }
  setInterval(tickTimes, 10000);

  // -- status messages (never a native alert) ----------------------------------------------------------
  let flashTimer = null;
  function flash(text, kind) {
    const f = $("#flash");
    f.textContent = text;
    f.className = `flash ${kind || "note"}`;
    f.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { f.hidden = true; }, 8000);
  }

  // -- login ----------------------------------------------------------------------------------------------
  function showLogin() {
    if (source) { source.close(); source = null; }
    $("#main").hidden = true; $("#logout").hidden = true; $("#nav").hidden = true; $("#login").hidden = false;
    setLive(false);
  }
  async function showMain() {
    $("#login").hidden = true; $("#main").hidden = false; $("#logout").hidden = false; $("#nav").hidden = false;
    await loadEvents();
    await loadWorkers();
    connect();
    await route();
  }
  $("#login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("#login-error").textContent = "";
    try {
      await api("POST", "api/session", { token: $("#token").value });
      $("#token").value = "";
      await showMain();
    } catch (e) { $("#login-error").textContent = e.message; }
  });
  $("#logout").addEventListener("click", async () => { await api("DELETE", "api/session"); showLogin(); });

  // -- routes -----------------------------------------------------------------------------------------------
  window.photojobsConsole = { api, el, timeEl, flash };  // for history.js (a photo's page, Undo)
  const hist = () => window.photojobsHistory;
  function currentView() {
    const h = location.hash || "#/";
    if (hist() && hist().isPhotoRoute(h)) return { view: "photo" };
    const m = /^#\/jobs\/(\d+)$/.exec(h);
    if (m) return { view: "job", id: Number(m[1]) };
    if (h === "#/lanes") return { view: "lanes" };
    return { view: "home" };
  }
  async function route() {
    if ($("#main").hidden) return;
    const r = currentView();
    for (const v of ["home", "job", "lanes"]) $(`#view-${v}`).hidden = v !== r.view;
    if (hist()) { if (r.view === "photo") { await hist().show(location.hash); return; } hist().hide(); }
    $("#nav-jobs").setAttribute("aria-current", r.view === "lanes" ? "false" : "page");
    $("#nav-lanes").setAttribute("aria-current", r.view === "lanes" ? "page" : "false");
    if (r.view === "job") {
      if (detail.id !== r.id) {
        detail.id = r.id; detail.st = null;
        detail.items = { state: "", lane: "", cursors: [null], page: 0, next: null };
        $("#item-state").value = ""; $("#item-lane").value = "";
      }
      document.title = `job #${r.id} · photojobs`;
      await loadJob();
      await loadItems();
    } else if (r.view === "lanes") {
      document.title = "lanes · photojobs";
      await loadLanes();
    } else {
      document.title = "photojobs";
      detail.id = null;
      await loadJobs();
    }
  }
  window.addEventListener("hashchange", () => { route(); });

  // -- submit --------------------------------------------------------------------------------------------------
  $("#submit-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const params = {};
    for (const line of $("#params").value.split("\n")) {
      const i = line.indexOf("=");
      if (line.trim() && i > 0) params[line.slice(0, i).trim()] = line.slice(i + 1);
    }
    const body = {
      lanes: $("#lanes").value.split(",").map((s) => s.trim()).filter(Boolean),
      paths: $("#paths").value.split("\n").map((s) => s.trim()).filter(Boolean),
      params,
    };
    const out = $("#submit-result");
    try {
      const r = await api("POST", "api/jobs", body);
      const left = Object.entries(r.skipped || {}).map(([why, n]) => `${n} ${why}`).join(", ");
      out.textContent = `job ${r.job} submitted: ${r.items} item(s)` + (left ? `; left out: ${left}` : "");
      out.className = "note";
      out.dataset.job = String(r.job);
      if (list.page === 0 && !list.state && !list.q) await loadJobs();
    } catch (e) { out.textContent = e.message; out.className = "error"; }
  });

  // -- the jobs list: newest first, paged by cursor, filtered and searched ---------------------------------------
  // A page's query: its limit, the filters that are set, and the cursor of the page shown (a list's
  // or a job's items: { cursors, page }).
  function pageQuery(limit, filters, pager) {
    const qs = new URLSearchParams({ limit: String(limit) });
    for (const [key, value] of Object.entries(filters)) if (value) qs.set(key, value);
    const after = pager.cursors[pager.page];
    if (after != null) qs.set("after", String(after));
    return qs;
  }

  async function loadJobs() {
    const qs = pageQuery(20, { state: list.state, q: list.q }, list);
    try {
      const r = await api("GET", `api/jobs?${qs}`);
      jobs.clear();
      for (const j of r.jobs) jobs.set(j.job, j);
      list.next = r.next;
      renderJobs();
    } catch (e) { if (e.status !== 401) flash(e.message, "error"); }
  }
  $("#jobs-filter").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    list.state = $("#job-state").value;
    list.q = $("#job-search").value.trim();
    list.cursors = [null]; list.page = 0;
    await loadJobs();
  });
  $("#jobs-older").addEventListener("click", async () => {
    if (list.next == null) return;
    list.cursors[list.page + 1] = list.next;
    list.page += 1;
    await loadJobs();
  });
  $("#jobs-newer").addEventListener("click", async () => {
    if (list.page === 0) return;
    list.page -= 1;
    await loadJobs();
  });

  async function refreshJob(id) {
    try {
      const st = await api("GET", `api/jobs/${id}`);
      if (jobs.has(id)) { jobs.set(id, st); renderJobs(); }
      if (detail.id === id) { detail.st = st; renderDetail(); }
    } catch (e) { if (e.status === 404) { jobs.delete(id); renderJobs(); } }
  }
  function laneRow(lane, counts) {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const done = DONE.reduce((a, s) => a + (counts[s] || 0), 0);
    const pct = total ? Math.floor((100 * done) / total) : 0;
    const seg = (cls, n) => el("span", { class: cls, style: `width:${total ? (100 * n) / total : 0}%` });
    const bar = el("div", { class: "bar", role: "progressbar", "data-percent": String(pct), "aria-valuenow": String(pct),
      "aria-valuemin": "0", "aria-valuemax": "100", "aria-label": `${lane} ${pct}%` },
    seg("ok", counts.succeeded || 0), seg("bad", counts.failed || 0),
    seg("other", (counts.cancelled || 0) + (counts.skipped || 0)), seg("run", counts.running || 0));
    const parts = [`${done}/${total}`, `${pct}%`];
    if (counts.failed) parts.push(`${counts.failed} failed`);
    if (counts.running) parts.push(`${counts.running} running`);
    return el("div", { class: "lane", "data-lane": lane, "data-percent": String(pct) },
      el("span", { class: "lane-name" }, lane), bar, el("span", { class: "counts" }, parts.join(" · ")));
  }
  async function act(id, name, query) {
    try {
      const r = await api("POST", `api/jobs/${id}/${name}${query || ""}`);
      flash(`job ${id}: ${name} — ${r.changed} item(s) changed`, "note");
    } catch (e) {
      flash(e.status === 409 ? `job ${id}: ${e.message} (the page was behind; refreshed)` : e.message, "error");
    }
    await refreshJob(id);
  }
  function action(id, name, enabled, query, label) {
    return el("button", { type: "button", class: `act-${name}`, disabled: !enabled, onclick: (ev) => { ev.stopPropagation(); act(id, name, query); } },
      label || name[0].toUpperCase() + name.slice(1));
  }
  function jobCard(st, linked) {
    const id = st.job;
    const t = st.totals || {};
    const title = `#${id} ${st.lane_order.join(" → ")}`;
    const head = el("div", { class: "job-head" },
      linked ? el("a", { class: "title", href: `#/jobs/${id}` }, title) : el("span", { class: "title" }, title),
      el("span", { class: `state ${st.state}` }, st.state),
      st.created_at ? el("span", { class: "note" }, "created ", timeEl(st.created_at)) : null,
      el("div", { class: "actions" },
        action(id, "pause", st.state === "running"),
        action(id, "resume", st.state === "paused" || st.state === "pausing"),
        action(id, "cancel", ["running", "paused", "pausing", "submitting"].includes(st.state)),
        action(id, "retry", !!((t.failed || 0) + (t.cancelled || 0))),
        !linked && hist() ? hist().undoButton(id, st) : null));
    const lanes = st.lane_order.map((lane) => laneRow(lane, st.lanes[lane] || {}));
    return el("div", { class: "job", "data-job": String(id), "data-state": st.state }, head, ...lanes);
  }
  function renderJobs() {
    const box = $("#jobs");
    const ids = [...jobs.keys()].sort((a, b) => b - a);
    box.replaceChildren(...ids.map((id) => jobCard(jobs.get(id), true)));
    if (!ids.length) box.append(el("p", { class: "note" }, list.state || list.q ? "No job matches." : "No jobs yet."));
    $("#jobs-newer").disabled = list.page === 0;
    $("#jobs-older").disabled = list.next == null;
    $("#jobs-page").textContent = `page ${list.page + 1}` + (list.state ? ` · ${list.state}` : "") + (list.q ? ` · “${list.q}”` : "");
  }

  // -- a job's page -------------------------------------------------------------------------------------------------
  async function loadJob() {
    const id = detail.id;
    try {
      detail.st = await api("GET", `api/jobs/${id}`);
      if (detail.id === id) renderDetail();
    } catch (e) {
      if (e.status === 404) {
        $("#job-card").replaceChildren(el("p", { class: "error" }, `No job #${id} (never submitted, or pruned).`));
        $("#failures").replaceChildren(); $("#job-times").replaceChildren(); $("#job-params").replaceChildren();
      } else if (e.status !== 401) flash(e.message, "error");
    }
  }
  function fact(box, term, ...value) { box.append(el("dt", {}, term), el("dd", {}, ...value)); }
  function renderDetail() {
    const st = detail.st;
    if (!st) return;
    $("#detail-id").textContent = `#${st.job}`;
    $("#job-card").replaceChildren(jobCard(st, false));
    const times = st.times || {};
    const tbox = $("#job-times");
    tbox.replaceChildren();
    fact(tbox, "Created", timeEl(times.created_at || st.created_at));
    fact(tbox, "Started", timeEl(times.started_at), times.waited != null ? ` (waited ${duration(times.waited)})` : "");
    fact(tbox, "Finished", timeEl(times.finished_at));
    fact(tbox, times.finished_at != null ? "Ran" : "Running for", duration(times.ran));
    if (times.took != null) fact(tbox, "Took", duration(times.took));
    if (times.finished_at == null) fact(tbox, "ETA", times.eta == null ? "– (no recent rate)" : `about ${duration(times.eta)}`);
    const pbox = $("#job-params");
    pbox.replaceChildren();
    const entries = Object.entries(st.params || {}).filter(([k]) => !k.startsWith("job."));
    for (const [k, v] of entries) fact(pbox, k, typeof v === "string" ? v : JSON.stringify(v));
    if (!entries.length) pbox.append(el("dd", { class: "note" }, "none"));
    const laneSel = $("#item-lane");
    const want = st.lane_order.join(",");
    if (laneSel.dataset.lanes !== want) {
      const keep = laneSel.value;
      laneSel.replaceChildren(el("option", { value: "" }, "any"), ...st.lane_order.map((l) => el("option", { value: l }, l)));
      laneSel.dataset.lanes = want;
      laneSel.value = keep;
    }
    renderFailures(st);
  }
  function groupQuery(g) { return `?lane=${encodeURIComponent(g.lane)}&reason=${encodeURIComponent(g.reason)}`; }
  function exampleItem(x) {
    return el("li", { "data-item": String(x.item || x.id) }, `item ${x.item || x.id}: ${x.path || ""} — ${x.error || ""}`);
  }
  function renderFailures(st) {
    const groups = st.failures || [];
    const box = $("#failures");
    box.replaceChildren(...groups.map((g) => {
      const examples = el("ul", {}, ...g.examples.map(exampleItem));
      const buttons = [];
      if (g.state === "failed") {
        buttons.push(action(st.job, "retry", true, groupQuery(g), `Retry ${g.count}`));
        buttons.push(action(st.job, "discard", true, groupQuery(g), "Discard"));
      }
      if (g.count > g.examples.length) {
        buttons.push(el("button", { type: "button", class: "act-show", onclick: () => showAll(st.job, g, examples) }, `Show all ${g.count}`));
      }
      return el("div", { class: "failure", "data-lane": g.lane, "data-count": String(g.count), "data-state": g.state },
        el("div", { class: "failure-head" }, el("strong", {}, `${g.count} × ${g.state} in ${g.lane}`), el("span", { class: "actions" }, ...buttons)),
        el("div", { class: "reason" }, g.reason), examples);
    }));
    if (!groups.length) box.append(el("p", { class: "note" }, "No failures."));
    const left = Object.entries(st.skipped || {}).map(([why, n]) => `${n} ${why}`).join(", ");
    if (left) box.append(el("p", { class: "note", id: "skipped" }, `Left out by the folder scan: ${left}.`));
  }
  async function showAll(id, g, ul) {
    const rows = [];
    let after = null;
    try {
      for (let i = 0; i < 20; i++) {
        const qs = new URLSearchParams({ lane: g.lane, reason: g.reason, state: g.state, limit: "1000" });
        if (after != null) qs.set("after", String(after));
        const r = await api("GET", `api/jobs/${id}/failures?${qs}`);
        rows.push(...r.items);
        if (r.next == null) break;
        after = r.next;
      }
      ul.replaceChildren(...rows.map(exampleItem));
      ul.classList.add("all");
    } catch (e) { flash(e.message, "error"); }
  }

  async function loadItems() {
    const id = detail.id;
    const it = detail.items;
    const qs = pageQuery(50, { state: it.state, lane: it.lane }, it);
    try {
      const r = await api("GET", `api/jobs/${id}/items?${qs}`);
      if (detail.id !== id) return;
      it.next = r.next;
      const cell = (label, ...c) => el("td", { "data-label": label }, ...c);
      $("#items tbody").replaceChildren(...r.items.map((x) => el("tr", { "data-item": String(x.id), "data-state": x.state },
        cell("item", String(x.id)), cell("lane", x.lane), cell("state", el("span", { class: `state ${x.state}` }, x.state)),
        cell("attempts", String(x.attempt)), cell("worker", x.worker || "–"), cell("photo", x.path && hist() ? hist().photoLink(x.path) : x.path || "–"),
        cell("error", x.error || ""), cell("updated", timeEl(x.updated_at)))));
      $("#items-first").disabled = it.page === 0;
      $("#items-more").disabled = it.next == null;
      $("#items-page").textContent = r.items.length ? `page ${it.page + 1}` : "no items match";
    } catch (e) { if (e.status !== 401 && e.status !== 404) flash(e.message, "error"); }
  }
  $("#items-filter").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    detail.items = { state: $("#item-state").value, lane: $("#item-lane").value, cursors: [null], page: 0, next: null };
    await loadItems();
  });
  $("#items-more").addEventListener("click", async () => {
    const it = detail.items;
    if (it.next == null) return;
    it.cursors[it.page + 1] = it.next; it.page += 1;
    await loadItems();
  });
  $("#items-first").addEventListener("click", async () => { detail.items.page = 0; await loadItems(); });

  // -- lanes: depth, throughput chart, workers, pause/resume ------------------------------------------------------
  function chart(lane, counts, start, bucket) {
    const w = 600, h = 80, n = counts.length || 1;
    const max = Math.max(1, ...counts);
    const total = counts.reduce((a, b) => a + b, 0);
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("class", "chart");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", `${lane}: ${total} items finished in the last ${Math.round((n * bucket) / 60)} minutes, at most ${max === 1 && !total ? 0 : max} a minute`);
    svg.setAttribute("data-total", String(total));
    const bw = w / n;
    counts.forEach((c, i) => {
      if (!c) return;
      const r = document.createElementNS(SVG, "rect");
      const bh = Math.max(2, (h - 4) * (c / max));
      r.setAttribute("x", String(i * bw + 0.5));
      r.setAttribute("y", String(h - bh));
      r.setAttribute("width", String(Math.max(1, bw - 1)));
      r.setAttribute("height", String(bh));
      const title = document.createElementNS(SVG, "title");
      title.textContent = `${c} finished in the minute from ${absolute(start + i * bucket)}`;
      r.append(title);
      svg.append(r);
    });
    const base = document.createElementNS(SVG, "line");
    base.setAttribute("x1", "0"); base.setAttribute("x2", String(w));
    base.setAttribute("y1", String(h - 0.5)); base.setAttribute("y2", String(h - 0.5));
    base.setAttribute("class", "axis");
    svg.append(base);
    return svg;
  }
  async function laneControl(lane, verb) {
    try {
      const r = await api("POST", `api/lanes/${encodeURIComponent(lane)}/${verb}`);
      flash(r.changed ? `lane ${lane}: ${verb}d` : `lane ${lane} was already ${verb === "pause" ? "paused" : "running"}`, "note");
    } catch (e) { flash(e.message, "error"); }
    await loadLanes();
  }
  async function loadLanes() {
    let r;
    try { r = await api("GET", "api/console/lanes"); } catch (e) { if (e.status !== 401) flash(e.message, "error"); return; }
    const cards = r.lanes.map((l) => {
      const d = l.depth || {};
      const total = l.finished_total || 0;
      const stat = (name) => el("div", { class: "stat" }, el("span", { class: "num" }, String(d[name] || 0)), el("span", { class: "note" }, name));
      const workers = l.workers.length
        ? el("ul", { class: "lane-workers" }, ...l.workers.map((w) => el("li", {}, `${w.host}:${w.pid} (${w.held} held)`)))
        : el("p", { class: "note" }, "no live worker serves this lane");
      return el("section", { class: "lane-card panel", "data-lane": l.lane, "data-paused": String(!!l.paused),
        "data-pending": String(d.pending || 0), "data-queued": String(d.queued || 0), "data-running": String(d.running || 0),
        "data-finished": String(total), "aria-label": `lane ${l.lane}` },
      el("div", { class: "job-head" }, el("h3", {}, l.lane),
        el("span", { class: `state ${l.paused ? "paused" : "running"}` }, l.paused ? "paused" : "running"),
        l.paused && l.paused_at ? el("span", { class: "note" }, "since ", timeEl(l.paused_at)) : null,
        el("div", { class: "actions" },
          el("button", { type: "button", class: "act-lane-pause", disabled: !!l.paused, onclick: () => laneControl(l.lane, "pause") }, "Pause lane"),
          el("button", { type: "button", class: "act-lane-resume", disabled: !l.paused, onclick: () => laneControl(l.lane, "resume") }, "Resume lane"))),
      el("div", { class: "stats" }, stat("waiting"), stat("pending"), stat("queued"), stat("running"), stat("paused"),
        el("div", { class: "stat" }, el("span", { class: "num" }, String(total)), el("span", { class: "note" }, "finished, last hour"))),
      chart(l.lane, l.finished || [], r.start, r.bucket),
      el("h4", {}, "Live workers"), workers);
    });
    $("#lane-cards").replaceChildren(...cards);
  }
  setInterval(() => { if (!$("#main").hidden && currentView().view === "lanes") loadLanes(); }, 2000);

  // -- workers and events -----------------------------------------------------------------------------------------
  async function loadWorkers() {
    try {
      const r = await api("GET", "api/workers");
      const cell = (label, ...c) => el("td", { "data-label": label }, ...c);
      const rows = r.workers.map((w) => {
        const state = w.state || "live";
        let beat = "–";
        if (state === "stopped" && w.stopped_at) beat = el("span", {}, "stopped ", timeEl(w.stopped_at));
        else if (w.last_heartbeat != null) beat = timeEl(w.last_heartbeat);
        return el("tr", { "data-worker": w.id, "data-state": state, class: `worker-${state}` },
          cell("worker", `${w.host}:${w.pid}`), cell("state", state), cell("lanes", w.lanes.join(", ")),
          cell("items", String(w.held)), cell("heartbeat", beat));
      });
      $("#workers tbody").replaceChildren(...rows);
      $("#no-workers").hidden = rows.length > 0;
    } catch (e) { /* shown by the login screen on 401 */ }
  }
  function addEvent(e) {
    const what = [`job ${e.job ?? "-"}`, e.lane || "", e.item ? `item ${e.item}` : "", e.type].filter(Boolean).join(" ");
    const events = $("#events");
    events.prepend(el("li", { "data-cursor": String(e.cursor), "data-type": e.type }, el("span", { class: "cursor" }, String(e.cursor)), " ", timeEl(e.at), " ", what));
    while (events.children.length > 100) events.lastChild.remove();
  }
  async function loadEvents() {
    const r = await api("GET", "api/events?tail=50");
    $("#events").replaceChildren();
    for (const e of r.events) addEvent(e);
    cursor = r.next || 0;
  }
  function setLive(on) {
    const b = $("#live");
    b.textContent = on ? "live" : "offline";
    b.className = on ? "live on" : "live off";
  }
  function connect() {
    if (source) source.close();
    source = new EventSource(`api/events/stream?after=${cursor}`);
    source.onopen = () => setLive(true);
    source.onerror = () => setLive(false);   // the browser reconnects with Last-Event-ID
    const onEvent = (msg) => {
      const e = JSON.parse(msg.data);
      cursor = e.cursor;
      addEvent(e);
      if (e.job != null) dirty.add(e.job);
      if (e.type === "job_submitted") dirty.add("list");
      if (e.type === "lane_paused" || e.type === "lane_resumed") lanesDirty = true;
      if (!refreshTimer) refreshTimer = setTimeout(flush, 300);
    };
    // Every event type arrives as its own SSE event name: listen to the generic handler for all.
    source.addEventListener("message", onEvent);
    const types = ["job_submitted", "item_created", "item_queued", "item_claimed", "item_claim_failed", "item_succeeded",
      "item_failed", "item_retry_scheduled", "item_cancelled", "item_paused", "item_resumed", "item_released", "item_ready",
      "item_skipped", "item_deferred", "item_retried", "item_discarded", "item_republished", "item_waiting", "item_pending",
      "job_cancel_requested", "job_pause_requested", "job_resumed", "job_retried", "lane_paused", "lane_resumed",
      "lease_expired", "stale_commit_rejected", "message_rejected", "intent_recorded", "intent_applied", "intent_discarded"];
    for (const t of types) source.addEventListener(t, onEvent);
  }
  async function flush() {
    refreshTimer = null;
    const ids = [...dirty]; dirty.clear();
    const view = currentView().view;
    if (view === "home") {
      const newer = ids.includes("list") || ids.some((id) => typeof id === "number" && !jobs.has(id) && id > Math.max(0, ...jobs.keys()));
      if (newer && list.page === 0 && !list.state && !list.q) await loadJobs();
      else for (const id of ids) if (jobs.has(id)) await refreshJob(id);
      await loadWorkers();
    } else if (view === "job" && ids.includes(detail.id)) {
      await loadJob();
      await loadItems();
    } else if (view === "lanes" && lanesDirty) {
      lanesDirty = false;
      await loadLanes();
    }
  }
  setInterval(() => { if (!$("#main").hidden && currentView().view === "home") loadWorkers(); }, 3000);

  // -- start ------------------------------------------------------------------------------------------------------------
  api("GET", "api/session").then(showMain).catch(showLogin);
})();
