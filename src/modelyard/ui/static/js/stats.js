// Windowed values from cumulative snapshots, as Prometheus' rate() and histogram_quantile() do.
// A histogram is {le: [upper bounds..., "+Inf"], counts: [cumulative], sum, count}.

/** The histogram of what happened between two snapshots (before may be undefined). */
export function histDelta(now, before) {
  if (!now) return null;
  if (!before || before.le.length !== now.le.length || before.count > now.count) return now;
  return {
    le: now.le,
    counts: now.counts.map((c, i) => c - before.counts[i]),
    sum: now.sum - before.sum,
    count: now.count - before.count,
  };
}

/** Bucket-wise sum of histograms with the same bounds (e.g. one per model). */
export function histSum(hists) {
  const present = hists.filter(Boolean);
  if (!present.length) return null;
  const [first] = present;
  const same = present.filter((h) => h.le.length === first.le.length);
  return {
    le: first.le,
    counts: first.counts.map((_, i) => same.reduce((acc, h) => acc + h.counts[i], 0)),
    sum: same.reduce((acc, h) => acc + h.sum, 0),
    count: same.reduce((acc, h) => acc + h.count, 0),
  };
}

/** The q-quantile by linear interpolation inside the bucket (null when empty). */
export function quantile(q, hist) {
  if (!hist || hist.count <= 0) return null;
  const total = hist.counts[hist.counts.length - 1];
  const rank = q * total;
  for (let i = 0; i < hist.counts.length; i += 1) {
    if (hist.counts[i] < rank || hist.counts[i] === 0) continue;
    const lower = i === 0 ? 0 : Number(hist.le[i - 1]);
    if (hist.le[i] === "+Inf") return lower;
    const below = i === 0 ? 0 : hist.counts[i - 1];
    const inBucket = hist.counts[i] - below;
    return lower + (Number(hist.le[i]) - lower) * ((rank - below) / inBucket);
  }
  return null;
}

export function mean(hist) {
  return hist && hist.count > 0 ? hist.sum / hist.count : null;
}

export function formatSeconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  if (s < 1) return `${(s * 1000).toFixed(s < 0.01 ? 1 : 0)} ms`;
  return `${s.toFixed(2)} s`;
}

export function formatBytes(n) {
  if (!Number.isFinite(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(v >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

export function formatRate(perSecond) {
  if (perSecond === null || !Number.isFinite(perSecond)) return "—";
  return perSecond >= 10 ? perSecond.toFixed(0) : perSecond.toFixed(2);
}

export function formatCount(n) {
  return Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "—";
}

export function formatAgo(seconds) {
  if (!Number.isFinite(seconds)) return "—";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}
