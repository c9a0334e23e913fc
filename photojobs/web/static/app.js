// photojobs dashboard: plain script, same-origin fetches with the session cookie, live via SSE.
"use strict";
(function () {
  const $ = (sel) => document.querySelector(sel);
  const DONE = ["succeeded", "failed", "cancelled", "skipped"];
  const jobs = new Map();          // job id -> STATUS
  let source = null;
  let cursor = 0;
  let selected = null;
  const dirty = new Set();
  let refreshTimer = null;

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
      if (k === "class") node.className = v;
      else if (k === "onclick") node.addEventListener("click", v);
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }

  // -- login ----------------------------------------------------------------------------------
  function showLogin() {
    if (source) { source.close(); source = null; }
    $("#main").hidden = true; $("#logout").hidden = true; $("#login").hidden = false;
    setLive(false);
  }
  async function showMain() {
    $("#login").hidden = true; $("#main").hidden = false; $("#logout").hidden = false;
    await loadJobs();
    await loadEvents();
    await loadWorkers();
    connect();
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

  // -- submit ----------------------------------------------------------------------------------
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
      await refreshJob(r.job);
      const left = Object.entries(r.skipped || {}).map(([why, n]) => `${n} ${why}`).join(", ");
      out.textContent = `job ${r.job} submitted: ${r.items} item(s)` + (left ? `; left out: ${left}` : "");
      out.className = "note";
      out.dataset.job = String(r.job);
    } catch (e) { out.textContent = e.message; out.className = "error"; }
  });

  // -- jobs ----------------------------------------------------------------------------------------
  async function loadJobs() {
    const r = await api("GET", "api/jobs?limit=20");
    jobs.clear();
    for (const j of r.jobs) jobs.set(j.job, j);
    renderJobs();
  }
  async function refreshJob(id) {
    try {
      const st = await api("GET", `api/jobs/${id}`);
      jobs.set(id, st);
      renderJobs();
      if (selected === id) renderFailures(st);
    } catch (e) { if (e.status === 404) { jobs.delete(id); renderJobs(); } }
  }
  function laneRow(job, lane, counts) {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const done = DONE.reduce((a, s) => a + (counts[s] || 0), 0);
    const pct = total ? Math.floor((100 * done) / total) : 0;
    const seg = (cls, n) => el("span", { class: cls, style: `width:${total ? (100 * n) / total : 0}%` });
    const bar = el("div", { class: "bar", role: "progressbar", "data-percent": String(pct) },
      seg("ok", counts.succeeded || 0), seg("bad", counts.failed || 0),
      seg("other", (counts.cancelled || 0) + (counts.skipped || 0)), seg("run", counts.running || 0));
    bar.setAttribute("aria-valuenow", String(pct));
    bar.setAttribute("aria-label", `${lane} ${pct}%`);
    const parts = [`${done}/${total}`, `${pct}%`];
    if (counts.failed) parts.push(`${counts.failed} failed`);
    if (counts.running) parts.push(`${counts.running} running`);
    return el("div", { class: "lane", "data-lane": lane, "data-percent": String(pct) },
      el("span", {}, lane), bar, el("span", { class: "counts" }, parts.join(" · ")));
  }
  function action(id, name, enabled, query) {
    return el("button", { class: `act-${name}`, disabled: !enabled, onclick: async (ev) => {
      ev.stopPropagation();
      try { await api("POST", `api/jobs/${id}/${name}${query || ""}`); }
      catch (e) { alert(e.message); }
      await refreshJob(id);
    } }, name[0].toUpperCase() + name.slice(1));
  }
  function renderJobs() {
    const box = $("#jobs");
    const ids = [...jobs.keys()].sort((a, b) => b - a).slice(0, 20);
    box.replaceChildren(...ids.map((id) => {
      const st = jobs.get(id);
      const t = st.totals || {};
      const head = el("div", { class: "job-head" },
        el("span", { class: "title", onclick: () => select(id) }, `#${id} ${st.lane_order.join(" → ")}`),
        el("span", { class: `state ${st.state}` }, st.state),
        el("div", { class: "actions" },
          action(id, "pause", st.state === "running"),
          action(id, "resume", st.state === "paused" || st.state === "pausing"),
          action(id, "cancel", ["running", "paused", "pausing"].includes(st.state)),
          action(id, "retry", !!((t.failed || 0) + (t.cancelled || 0)))));
      const lanes = st.lane_order.map((lane) => laneRow(id, lane, st.lanes[lane] || {}));
      return el("div", { class: "job", "data-job": String(id), "data-state": st.state }, head, ...lanes);
    }));
    if (!ids.length) box.append(el("p", { class: "note" }, "No jobs yet."));
  }
  async function select(id) {
    selected = id;
    const st = await api("GET", `api/jobs/${id}`);
    jobs.set(id, st);
    renderFailures(st);
  }
  function renderFailures(st) {
    $("#detail-panel").hidden = false;
    $("#detail-id").textContent = `#${st.job}`;
    const groups = st.failures || [];
    const box = $("#failures");
    box.replaceChildren(...groups.map((g) => el("div", { class: "failure", "data-lane": g.lane, "data-count": String(g.count) },
      el("div", {}, el("strong", {}, `${g.count} × ${g.state} in ${g.lane}`), " ",
        g.state === "failed" ? action(st.job, "retry", true, `?lane=${encodeURIComponent(g.lane)}`) : ""),
      el("div", { class: "reason" }, g.reason),
      el("ul", {}, ...g.examples.map((x) => el("li", {}, `item ${x.item}: ${x.path || ""} — ${x.error || ""}`))))));
    if (!groups.length) box.append(el("p", { class: "note" }, "No failures."));
    const left = Object.entries(st.skipped || {}).map(([why, n]) => `${n} ${why}`).join(", ");
    if (left) box.append(el("p", { class: "note", id: "skipped" }, `Left out by the folder scan: ${left}.`));
  }

  // -- workers and events ----------------------------------------------------------------------------
  async function loadWorkers() {
    try {
      const r = await api("GET", "api/workers");
      const rows = r.workers.map((w) => el("tr", { "data-worker": w.id, "data-state": w.state || "live", class: `worker-${w.state || "live"}` },
        el("td", {}, `${w.host}:${w.pid}`), el("td", {}, w.state || "live"), el("td", {}, w.lanes.join(",")),
        el("td", {}, String(w.held)),
        el("td", {}, w.heartbeat_age == null ? "–" : `${w.heartbeat_age.toFixed(1)} s ago`)));
      $("#workers tbody").replaceChildren(...rows);
      $("#no-workers").hidden = rows.length > 0;
    } catch (e) { /* shown by the login screen on 401 */ }
  }
  function addEvent(e) {
    const at = new Date(e.at * 1000).toLocaleTimeString();
    const what = [`${e.cursor}`, at, `job ${e.job ?? "-"}`, e.lane || "", e.item ? `item ${e.item}` : "", e.type].filter(Boolean).join(" ");
    const list = $("#events");
    list.prepend(el("li", { "data-cursor": String(e.cursor), "data-type": e.type }, what));
    while (list.children.length > 100) list.lastChild.remove();
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
    source.onmessage = null;
    const onEvent = (msg) => {
      const e = JSON.parse(msg.data);
      cursor = e.cursor;
      addEvent(e);
      if (e.job != null) dirty.add(e.job);
      if (!refreshTimer) refreshTimer = setTimeout(flush, 300);
    };
    // Every event type arrives as its own SSE event name: listen to the generic handler for all.
    source.addEventListener("message", onEvent);
    const types = ["job_submitted", "item_created", "item_queued", "item_claimed", "item_succeeded", "item_failed",
      "item_retry_scheduled", "item_cancelled", "item_paused", "item_resumed", "item_released", "item_ready",
      "item_skipped", "item_deferred", "item_retried", "item_republished", "item_waiting", "item_pending",
      "job_cancel_requested", "job_pause_requested", "job_resumed", "job_retried", "lease_expired",
      "stale_commit_rejected", "message_rejected", "intent_recorded", "intent_applied", "intent_discarded"];
    for (const t of types) source.addEventListener(t, onEvent);
  }
  async function flush() {
    refreshTimer = null;
    const ids = [...dirty]; dirty.clear();
    for (const id of ids) await refreshJob(id);
    await loadWorkers();
  }
  setInterval(() => { if (!$("#main").hidden) loadWorkers(); }, 3000);

  // -- start ---------------------------------------------------------------------------------------------
  api("GET", "api/session").then(showMain).catch(showLogin);
})();
