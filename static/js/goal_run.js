/* The Session's goal run (sessions_app/runtime/goal_driver.py) in the Goal run card: the form that
 * starts one, and the run's status, round, budgets, last decision, Resume and Stop. Used by
 * the Session page (js/session/) as `window.xagent.goalRun.card(options)`; the words shared with the timeline notes
 * (`decisionText`, `formatTokens`, `formatDuration`) are exported beside it.
 *
 * The card starts from the run the page was rendered with (`initial`: as `GET …/goal-run/` answers,
 * the open run, else the latest; null: none yet) and reads it again when the Session page (js/session/) tells it that
 * something changed (`goal.*`; `turn.ended` while a run is open): the driver owns every fact, the
 * card only renders and asks. Between reads the elapsed time of an
 * open run ticks on locally. The goal is user text: only ever set as text.
 */
(function () {
  "use strict";
  const { api, el, statusBadge, ApiError } = window.xagent;

  const MAX_TIME_BUDGET_S = 86400; // the API's limit for wall_clock_seconds
  const GOAL_SHOWN_CHARS = 240;
  const TICK_MS = 1000;
  const OPEN = new Set(["active", "paused"]);
  // The API's field -> the form's field (the time budget is asked as hours:minutes).
  const FORM_FIELDS = { goal: "goal", max_rounds: "max_rounds", token_budget: "token_budget", wall_clock_seconds: "wall_clock" };

  /** 200000 -> "200 000" (narrow no-break spaces: a number never wraps). */
  function formatTokens(value) {
    const digits = String(Math.max(0, Math.round(Number(value) || 0)));
    return digits.replace(/\B(?=(\d{3})+(?!\d))/g, "\u202f");
  }

  /** 3600 -> "1 h", 5400 -> "1 h 30 min", 185 -> "3 min 5 s" (seconds only below an hour). */
  function formatDuration(value) {
    const total = Math.max(0, Math.floor(Number(value) || 0));
    const hours = Math.floor(total / 3600);
    const minutes = Math.floor((total % 3600) / 60);
    const seconds = total % 60;
    const parts = [];
    if (hours) parts.push(`${hours} h`);
    if (minutes) parts.push(`${minutes} min`);
    if (seconds && !hours) parts.push(`${seconds} s`);
    return parts.length ? parts.join(" ") : "0 s";
  }

  /**
   * A time budget as a person types it: "1:30" (hours:minutes), "90" (minutes), "1h 30m", "45 min".
   * Returns {seconds} or {error}.
   */
  function parseDuration(text) {
    const value = String(text || "").trim().toLowerCase();
    let seconds = null;
    let match;
    if (!value) return { error: "Give a time budget, e.g. 1:00 (an hour) or 90 (minutes)." };
    if ((match = /^(\d{1,3}):([0-5]\d)$/.exec(value))) seconds = Number(match[1]) * 3600 + Number(match[2]) * 60;
    else if ((match = /^(\d{1,5})\s*(?:m|min|mins|minutes?)?$/.exec(value))) seconds = Number(match[1]) * 60;
    else if ((match = /^(?:(\d{1,3})\s*(?:h|hours?))\s*(?:(\d{1,4})\s*(?:m|min|mins|minutes?))?$/.exec(value))) {
      seconds = Number(match[1]) * 3600 + Number(match[2] || 0) * 60;
    }
    if (seconds === null) return { error: "Use hours:minutes (1:30) or minutes (90)." };
    if (seconds < 60) return { error: "At least 1 minute." };
    if (seconds > MAX_TIME_BUDGET_S) return { error: "At most 24:00 (24 hours)." };
    return { seconds };
  }

  /** "200 000", "200,000" or "200_000" -> 200000; anything else is sent as typed (the API says why). */
  function parseCount(text) {
    const value = String(text || "").trim();
    const plain = value.replace(/[\s_,\u202f]/g, "");
    return /^\d+$/.test(plain) ? Number(plain) : value;
  }

  const QUEUED_PREFIX = /^round (\d+) of (\d+) queued:\s*/;

  /**
   * A decision in words, the same in the card and the timeline:
   * continue -> "Round 1 of 3 done — continuing: 2 open plan tasks" (the reason's "round 2 of 3
   * queued" is what "continuing" says), done -> "Goal reached after round 2: …", stop -> "Goal
   * run stopped after round 3: …". With `username`, the viewer's own stop reads "stopped by you".
   */
  function decisionText(decision, round, maxRounds, reason, username) {
    let why = String(reason || "").trim();
    if (username && why === `stopped by ${username}`) why = "stopped by you";
    if (decision === "continue") {
      const queued = QUEUED_PREFIX.exec(why);
      const limit = maxRounds || (queued ? Number(queued[2]) : null);
      const of = limit ? ` of ${limit}` : "";
      if (queued) why = why.slice(queued[0].length);
      // Resumed before any round ended (the queued one was taken back): round 1 again.
      if (!round) return `Continuing: round 1${of} queued${why ? ` (${why})` : ""}`;
      return `Round ${round}${of} done — continuing${why ? `: ${why}` : ""}`;
    }
    const tail = why ? `: ${why}` : "";
    if (decision === "done") return `Goal reached after round ${round}${tail}`;
    if (!round) return `Goal run stopped before any round ended${tail}`;
    return `Goal run stopped after round ${round}${tail}`;
  }

  function excerpt(text, limit) {
    const oneLine = String(text || "").replace(/\s+/g, " ").trim();
    return oneLine.length > limit ? `${oneLine.slice(0, limit - 1).trimEnd()}…` : oneLine;
  }

  function describe(exc) {
    return exc instanceof ApiError ? exc.describe() : String(exc);
  }

  /** A labelled bar: "Tokens 12 345 of 200 000" over a fill that turns amber past 80 %, red at 100 %. */
  function meter(testid, label) {
    const value = el("span", { className: "meter-value" });
    const fill = el("span", { className: "meter-fill" });
    const bar = el("span", { className: "meter", attrs: { role: "progressbar", "aria-label": label, "aria-valuemin": 0, "aria-valuemax": 100 } }, fill);
    const node = el(
      "div",
      { className: "goal-run-meter", dataset: { testid } },
      el("div", { className: "meter-line" }, el("span", { className: "meter-label", text: label }), value),
      bar
    );
    return {
      node,
      set(used, budget, text) {
        const share = budget > 0 ? used / budget : 0;
        const percent = Math.min(100, Math.round(share * 100));
        value.textContent = text;
        fill.style.width = `${percent}%`;
        bar.setAttribute("aria-valuenow", String(percent));
        bar.setAttribute("aria-valuetext", text);
        node.dataset.level = share >= 1 ? "over" : share >= 0.8 ? "high" : "ok";
      },
    };
  }

  function goalRunCard({ root, apiBase, initial, username }) {
    const url = `${apiBase}goal-run/`;
    const ui = {
      pill: root.querySelector("[data-testid=goal-run-status]"),
      lead: root.querySelector("[data-testid=goal-run-lead]"),
      summary: root.querySelector("[data-testid=goal-run-summary]"),
      error: root.querySelector("[data-testid=goal-run-error]"),
      actions: root.querySelector("[data-testid=goal-run-actions]"),
      open: root.querySelector("[data-testid=goal-run-open]"),
      form: root.querySelector("[data-testid=goal-run-form]"),
      formError: root.querySelector("[data-testid=goal-run-form-error]"),
      start: root.querySelector("[data-testid=goal-run-start]"),
      cancel: root.querySelector("[data-testid=goal-run-cancel]"),
      goal: root.querySelector("#goal-run-goal"),
    };
    const state = {
      run: null,
      readAt: 0, // Date.now() of the read that gave `run` (its elapsed time ticks on from there)
      loaded: false,
      formOpen: false,
      confirmingStop: false,
      busy: false,
      reading: null,
      readAgain: false,
      ticker: null,
      time: null, // the time meter of the shown run
    };

    function setError(text) {
      ui.error.textContent = text || "";
      ui.error.hidden = !text;
    }

    // --- reading ------------------------------------------------------------------------------

    /** Read the run again: one read at a time, and one more after it when asked meanwhile. */
    function refresh() {
      if (state.reading) {
        state.readAgain = true;
        return state.reading;
      }
      state.reading = api(url)
        .then((run) => show(run))
        .catch((exc) => {
          if (exc instanceof ApiError && exc.status === 404) show(null);
          else setError(`Could not read the goal run: ${describe(exc)}`);
        })
        .finally(() => {
          state.reading = null;
          if (state.readAgain) {
            state.readAgain = false;
            refresh();
          }
        });
      return state.reading;
    }

    function show(run) {
      const was = state.run;
      state.run = run || null;
      state.readAt = Date.now();
      state.loaded = true;
      // Another tab (or a colleague) started one meanwhile: the form has nothing left to do.
      if (run && OPEN.has(run.status) && state.formOpen) closeForm(false);
      if (!run || !OPEN.has(run.status) || (was && was.id !== run.id)) state.confirmingStop = false;
      render();
    }

    // --- rendering ----------------------------------------------------------------------------

    function render() {
      const run = state.run;
      root.dataset.status = run ? run.status : "none";
      // Replaced only when it changes: it is a live region, and the card re-renders every read.
      const status = run ? run.status : "";
      if (ui.pill.dataset.status !== status) {
        ui.pill.dataset.status = status;
        ui.pill.replaceChildren(...(run ? [statusBadge(run.status)] : []));
      }
      ui.lead.hidden = Boolean(run);
      ui.summary.hidden = !run;
      ui.summary.replaceChildren(...(run ? summary(run) : []));
      ui.form.hidden = !state.formOpen;
      renderActions();
      tick();
      if (run && OPEN.has(run.status) && !state.ticker) state.ticker = window.setInterval(tick, TICK_MS);
      if ((!run || !OPEN.has(run.status)) && state.ticker) {
        window.clearInterval(state.ticker);
        state.ticker = null;
      }
    }

    function roundLine(run) {
      const of = `of ${run.max_rounds}`;
      if (run.status === "active") return `Round ${Math.min(run.rounds_done + 1, run.max_rounds)} ${of}`;
      const when = run.rounds_done ? `after round ${run.rounds_done} ${of}` : `before round 1 ${of}`;
      return `${{ paused: "Paused", done: "Done", stopped: "Stopped" }[run.status] || "Ended"} ${when}`;
    }

    function summary(run) {
      const goal = String(run.goal || "");
      const parts = [
        // The goal in a <bdi>: a direction override in it cannot flip the quotes around it.
        el(
          "p",
          {
            className: "goal-run-goal",
            dataset: { testid: "goal-run-goal" },
            attrs: { title: goal.length > GOAL_SHOWN_CHARS ? goal : null },
          },
          "“",
          el("bdi", { text: excerpt(goal, GOAL_SHOWN_CHARS) }),
          "”"
        ),
        el("p", { className: "goal-run-round", dataset: { testid: "goal-run-round" }, text: roundLine(run) }),
      ];
      const tokens = meter("goal-run-tokens", "Tokens");
      tokens.set(run.tokens_used, run.token_budget, `${formatTokens(run.tokens_used)} of ${formatTokens(run.token_budget)}`);
      state.time = meter("goal-run-time", "Time");
      parts.push(tokens.node, state.time.node);
      const last = run.last_decision;
      if (last) {
        parts.push(
          el(
            "p",
            { className: "goal-run-decision", dataset: { testid: "goal-run-decision", decision: last.decision } },
            el("span", { className: "goal-run-decision-label", text: "Last decision" }),
            el("span", { text: decisionText(last.decision, last.round, run.max_rounds, last.reason, username) })
          )
        );
      }
      if (run.status === "paused") {
        const reason = String(run.paused_reason || "").trim();
        parts.push(
          el(
            "div",
            { className: "goal-run-paused", dataset: { testid: "goal-run-paused" } },
            el("span", { className: "goal-run-paused-icon", attrs: { "aria-hidden": "true" }, text: "‖" }),
            el(
              "div",
              {},
              el("p", { text: reason ? `Paused: ${reason}.` : "Paused." }),
              el("p", { className: "muted", text: "Nothing runs until a person resumes it. Resume checks the budgets and the round limit, then queues the next round if they allow it." }),
              el("button", {
                className: "small",
                dataset: { testid: "goal-run-resume" },
                attrs: { type: "button", disabled: state.busy },
                text: "Resume",
                on: { click: resume },
              })
            )
          )
        );
      }
      return parts;
    }

    /** The elapsed time of an open run goes on between reads. */
    function tick() {
      const run = state.run;
      if (!run || !state.time) return;
      let elapsed = Number(run.elapsed_seconds) || 0;
      if (OPEN.has(run.status)) elapsed += Math.max(0, Math.floor((Date.now() - state.readAt) / 1000));
      state.time.set(elapsed, run.wall_clock_seconds, `${formatDuration(elapsed)} of ${formatDuration(run.wall_clock_seconds)}`);
    }

    function button(testid, text, onClick, className = "secondary small") {
      return el("button", { className, dataset: { testid }, attrs: { type: "button", disabled: state.busy }, text, on: { click: onClick } });
    }

    function renderActions() {
      const run = state.run;
      const items = [];
      if (run && OPEN.has(run.status)) {
        if (state.confirmingStop) {
          items.push(
            el("span", {
              className: "goal-run-confirm",
              attrs: { id: "goal-run-confirm-text" },
              text: "Stop this goal run? No new round starts; a round already running finishes.",
            }),
            button("goal-run-stop-confirm", "Yes, stop", stop, "danger small"),
            button("goal-run-stop-cancel", "Cancel", () => {
              state.confirmingStop = false;
              renderActions();
              focus("goal-run-stop");
            })
          );
        } else {
          items.push(button("goal-run-stop", "Stop…", confirmStop, "danger small"));
        }
      } else if (!state.formOpen && state.loaded) {
        ui.open.textContent = run ? "Start a new goal run" : "Run as a goal…";
        items.push(ui.open);
      }
      ui.open.setAttribute("aria-expanded", String(state.formOpen));
      ui.actions.replaceChildren(...items);
      ui.actions.hidden = items.length === 0;
    }

    function focus(testid) {
      const target = root.querySelector(`[data-testid=${testid}]`);
      if (target) target.focus();
    }

    // --- the form -----------------------------------------------------------------------------

    function fieldOf(name) {
      return ui.form.querySelector(`.goal-run-field[data-field=${name}]`);
    }

    function setFieldError(name, text) {
      const field = fieldOf(name);
      if (!field) return;
      const error = field.querySelector(".field-error");
      const input = field.querySelector("input, textarea");
      error.textContent = text || "";
      error.hidden = !text;
      if (text) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }

    function clearErrors() {
      for (const name of Object.values(FORM_FIELDS)) setFieldError(name, "");
      ui.formError.textContent = "";
      ui.formError.hidden = true;
    }

    function openForm() {
      state.formOpen = true;
      clearErrors();
      setError("");
      render();
      ui.goal.focus();
    }

    function closeForm(restoreFocus = true) {
      state.formOpen = false;
      clearErrors();
      render();
      if (restoreFocus) ui.open.focus();
    }

    /** A field's problem from the API, in the field's own words. */
    function fieldMessage(name, problems) {
      const said = [].concat(problems).map(String).join(" ");
      if (name === "wall_clock_seconds" && /less than or equal/.test(said)) return "At most 24:00 (24 hours).";
      if (name === "wall_clock_seconds" && /greater than or equal/.test(said)) return "At least 1 minute.";
      return said;
    }

    async function submit() {
      if (state.busy) return;
      clearErrors();
      const value = (name) => ui.form.querySelector(`[name=${name}]`).value;
      const time = parseDuration(value("wall_clock"));
      if (time.error) {
        setFieldError("wall_clock", time.error);
        ui.form.querySelector("[name=wall_clock]").focus();
        return;
      }
      const body = {
        goal: value("goal"),
        max_rounds: parseCount(value("max_rounds")),
        token_budget: parseCount(value("token_budget")),
        wall_clock_seconds: time.seconds,
      };
      state.busy = true;
      ui.start.disabled = ui.cancel.disabled = true;
      ui.start.textContent = "Starting…";
      try {
        const run = await api(url, { method: "POST", body });
        ui.goal.value = "";
        state.formOpen = false;
        setError("");
        show(run);
        focus("goal-run-stop");
      } catch (exc) {
        if (exc instanceof ApiError && exc.status === 400 && exc.details && Object.keys(exc.details).length) {
          let first = null;
          const other = [];
          for (const [name, problems] of Object.entries(exc.details)) {
            const field = FORM_FIELDS[name];
            if (field && fieldOf(field)) {
              setFieldError(field, fieldMessage(name, problems));
              first = first || field;
            } else {
              other.push([].concat(problems).join(" "));
            }
          }
          if (other.length) {
            ui.formError.textContent = `Not started: ${other.join(" ")}`;
            ui.formError.hidden = false;
          }
          if (first) ui.form.querySelector(`[name=${first}]`).focus();
        } else if (exc instanceof ApiError && exc.status === 409) {
          // A run is open already (another tab, a colleague): show it instead of the form.
          state.formOpen = false;
          setError(`Not started: ${exc.message}`);
          refresh();
        } else {
          ui.formError.textContent = `Not started: ${describe(exc)}`;
          ui.formError.hidden = false;
        }
      } finally {
        state.busy = false;
        ui.start.disabled = ui.cancel.disabled = false;
        ui.start.textContent = "Start the goal run";
        render();
      }
    }

    // --- resume and stop ----------------------------------------------------------------------

    function confirmStop() {
      setError("");
      state.confirmingStop = true;
      renderActions();
      focus("goal-run-stop-confirm");
    }

    async function act(path, verb) {
      if (state.busy) return;
      state.busy = true;
      render();
      try {
        show(await api(`${url}${path}`, { method: "POST" }));
        setError("");
      } catch (exc) {
        setError(`Not ${verb}: ${describe(exc)}`);
        refresh();
      } finally {
        state.busy = false;
        state.confirmingStop = false;
        render();
      }
    }

    function resume() {
      return act("resume/", "resumed");
    }

    function stop() {
      return act("stop/", "stopped");
    }

    if (initial !== undefined) show(initial);
    else render(); // nothing to offer until the first read says whether a run exists
    ui.open.addEventListener("click", openForm);
    ui.cancel.addEventListener("click", () => closeForm());
    ui.form.addEventListener("submit", (event) => {
      event.preventDefault();
      submit();
    });
    ui.form.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        closeForm();
      } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        submit();
      }
    });

    return {
      refresh,
      /** A turn ended: an open run's tokens, time and rounds moved on (a finished one's did not). */
      turnEnded() {
        if (state.run && OPEN.has(state.run.status)) refresh();
      },
      /** The run as last read (null: none, or not read yet). */
      current: () => state.run,
    };
  }

  window.xagent.goalRun = { card: goalRunCard, decisionText, formatTokens, formatDuration, parseDuration };
})();
