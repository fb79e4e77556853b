// rotator dashboard: live updates (server-sent events), the charts, and the actions.
// Shipped in the package and served by the dashboard itself: no CDN, no framework.
// The server renders (and escapes) every live part of a page; this script only swaps those
// parts in, draws the charts from numbers, and sends actions with the token the person typed.
"use strict";

(function () {
  const TOKEN_KEY = "rotator-dashboard-token";
  const HISTORY_SECONDS = 300;
  const COLORS = {
    teal: "#0f9d8a",
    indigo: "#5b5bd6",
    amber: "#d98a0b",
    blue: "#2f7de1",
    red: "#d3392f",
  };

  const body = document.body;
  const points = [];

  // -- live updates ------------------------------------------------------------------------

  function setLive(state, text) {
    const live = document.getElementById("live");
    if (!live) return;
    live.dataset.state = state;
    document.getElementById("live-text").textContent = text;
  }

  function showBanner(message) {
    const banner = document.getElementById("banner");
    if (!banner) return;
    if (message) {
      banner.textContent = message;
      banner.hidden = false;
    } else {
      banner.hidden = true;
    }
  }

  // A click is a press and a release on the same element. A swap between the two (a busy
  // table changes every second, if only its ages) would eat the click, so a press holds the
  // swaps, and the latest parts go in once the click has been delivered.
  let pressed = false;
  let heldParts = null;

  document.addEventListener("pointerdown", () => { pressed = true; }, true);
  for (const type of ["pointerup", "pointercancel"]) {
    document.addEventListener(type, () => {
      pressed = false;
      setTimeout(() => {
        if (pressed || !heldParts) return;
        const parts = heldParts;
        heldParts = null;
        swapParts(parts);
      }, 0);
    }, true);
  }

  function swapParts(html) {
    if (!html) return;
    if (pressed) {
      heldParts = html;
      return;
    }
    for (const element of document.querySelectorAll("[data-live]")) {
      const part = html[element.dataset.live];
      // Server-rendered and escaped; replaced only when it changed, so a button under the
      // pointer is not swapped away for nothing.
      if (typeof part === "string" && element.dataset.rendered !== part) {
        element.innerHTML = part;
        element.dataset.rendered = part;
      }
    }
  }

  function addPoints(snapshot) {
    if (Array.isArray(snapshot.history)) {
      points.length = 0;
      for (const p of snapshot.history) points.push(p);
    } else if (snapshot.point) {
      points.push(snapshot.point);
    }
    const oldest = (points.length ? points[points.length - 1].at : 0) - HISTORY_SECONDS;
    while (points.length && points[0].at < oldest) points.shift();
  }

  function showDiscovered(snapshot) {
    const element = document.getElementById("discovered");
    if (!element || !snapshot.discovered_at) return;
    const age = Math.max(0, Math.round(snapshot.at - snapshot.discovered_at));
    element.textContent = `${snapshot.queues.length} found by SCAN ${age} s ago`;
  }

  function connect() {
    const url = body.dataset.events;
    if (!url || !window.EventSource) return;
    setLive("off", "connecting");
    const source = new EventSource(url);
    source.addEventListener("snapshot", (event) => {
      const snapshot = JSON.parse(event.data);
      if (snapshot.error) {
        setLive("error", "server unreachable");
        showBanner(snapshot.error);
      } else {
        setLive("on", "live");
        showBanner("");
      }
      swapParts(snapshot.html);
      if (snapshot.kind === "overview") showDiscovered(snapshot);
      addPoints(snapshot);
      drawCharts();
    });
    source.addEventListener("error", () => setLive("off", "reconnecting"));
  }

  // -- charts ------------------------------------------------------------------------------

  // The axis top: four steps of 1, 2, 2.5 or 5 times a power of ten.
  function niceCeiling(value) {
    if (value <= 0) return 4;
    const step = value / 4;
    const power = Math.pow(10, Math.floor(Math.log10(step)));
    for (const factor of [1, 2, 2.5, 5, 10]) {
      if (step <= factor * power) return 4 * factor * power;
    }
    return 40 * power;
  }

  function shortNumber(value) {
    if (value >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
    if (value >= 1e3) return `${+(value / 1e3).toFixed(1)}k`;
    if (value >= 10 || value === 0) return `${Math.round(value)}`;
    return `${+value.toFixed(2)}`;
  }

  function drawChart(canvas) {
    const series = (canvas.dataset.series || "").split(",").filter(Boolean);
    const colors = (canvas.dataset.colors || "").split(",");
    if (!canvas.dataset.height) canvas.dataset.height = canvas.getAttribute("height") || "160";
    const height = Number(canvas.dataset.height);
    const width = canvas.clientWidth || 600;
    const ratio = window.devicePixelRatio || 1;
    canvas.style.height = `${height}px`;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);

    const left = 46;
    const right = 10;
    const top = 8;
    const bottom = 22;
    const plotWidth = width - left - right;
    const plotHeight = height - top - bottom;
    const end = points.length ? points[points.length - 1].at : Date.now() / 1000;
    const start = end - HISTORY_SECONDS;

    let highest = 0;
    for (const p of points) {
      for (const name of series) {
        const value = p[name];
        if (typeof value === "number" && value > highest) highest = value;
      }
    }
    const ceiling = niceCeiling(highest);

    ctx.font = "11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const y = top + plotHeight - (plotHeight * i) / 4;
      ctx.strokeStyle = i === 0 ? "#d5dae1" : "#eef0f3";
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(left, Math.round(y) + 0.5);
      ctx.lineTo(left + plotWidth, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillStyle = "#8a93a3";
      ctx.textAlign = "right";
      ctx.fillText(shortNumber((ceiling * i) / 4), left - 8, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "alphabetic";
    for (let minute = 5; minute >= 0; minute--) {
      const x = left + plotWidth - (plotWidth * minute * 60) / HISTORY_SECONDS;
      ctx.fillStyle = "#8a93a3";
      ctx.fillText(minute === 0 ? "now" : `-${minute} min`, Math.min(x, left + plotWidth - 12), height - 6);
    }

    if (points.length < 2) {
      ctx.fillStyle = "#a3abb8";
      ctx.textAlign = "center";
      ctx.fillText("waiting for readings…", left + plotWidth / 2, top + plotHeight / 2);
      return;
    }

    const lines = series.map((name, index) => {
      const xy = [];
      for (const p of points) {
        const value = p[name];
        if (typeof value !== "number") continue;
        const x = left + ((p.at - start) / HISTORY_SECONDS) * plotWidth;
        const y = top + plotHeight - (value / ceiling) * plotHeight;
        xy.push([x, y]);
      }
      return { xy, color: COLORS[colors[index]] || "#3056d3" };
    });
    // The first series is shaded and drawn last, on top of the others.
    const [main] = lines;
    if (main && main.xy.length > 1) {
      ctx.beginPath();
      ctx.moveTo(main.xy[0][0], top + plotHeight);
      for (const [x, y] of main.xy) ctx.lineTo(x, y);
      ctx.lineTo(main.xy[main.xy.length - 1][0], top + plotHeight);
      ctx.closePath();
      ctx.fillStyle = `${main.color}1f`;
      ctx.fill();
    }
    for (const line of lines.slice().reverse()) {
      if (line.xy.length < 2) continue;
      ctx.beginPath();
      line.xy.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
      ctx.strokeStyle = line.color;
      ctx.lineWidth = 2;
      ctx.lineJoin = "round";
      ctx.stroke();
    }
  }

  function drawCharts() {
    for (const canvas of document.querySelectorAll("canvas.chart")) drawChart(canvas);
  }

  // -- actions -----------------------------------------------------------------------------

  function token() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || "";
    } catch (error) {
      return "";
    }
  }

  function showTokenState() {
    const state = document.getElementById("token-state");
    if (state) state.textContent = token() ? "set for this tab" : "not set";
  }

  function showResult(ok, message) {
    const result = document.getElementById("action-result");
    if (!result) return;
    result.textContent = message;
    result.className = `action-result ${ok ? "ok" : "refused"}`;
    result.hidden = false;
  }

  async function sendAction(form) {
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    const headers = {
      Accept: "application/json",
      "Content-Type": "application/x-www-form-urlencoded",
    };
    const secret = token();
    if (secret) headers["X-Rotator-Token"] = secret;
    let answer;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        headers,
        body: new URLSearchParams(new FormData(form)),
        credentials: "same-origin",
      });
      answer = await response.json();
    } catch (error) {
      answer = { ok: false, message: `the dashboard did not answer: ${error}` };
    }
    showResult(Boolean(answer.ok), answer.message || "");
  }

  function setUpActions() {
    const tokenForm = document.getElementById("token-form");
    if (tokenForm) {
      tokenForm.addEventListener("submit", (event) => {
        event.preventDefault();
        const input = document.getElementById("token");
        try {
          if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
          else sessionStorage.removeItem(TOKEN_KEY);
        } catch (error) {
          showResult(false, "this browser keeps no session storage: the token is not kept");
        }
        input.value = "";
        showTokenState();
      });
      showTokenState();
    }
    // Delegated: the dead letters' rows are re-rendered as they change.
    document.addEventListener("submit", (event) => {
      const form = event.target;
      if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-action")) return;
      event.preventDefault();
      sendAction(form);
    });
  }

  // -- start -------------------------------------------------------------------------------

  function start() {
    setUpActions();
    drawCharts();
    connect();
    let pending = 0;
    window.addEventListener("resize", () => {
      clearTimeout(pending);
      pending = setTimeout(drawCharts, 100);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
