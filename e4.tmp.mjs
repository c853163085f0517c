let t = Date.now(); const lap = (m) => { console.log(m, Date.now() - t); t = Date.now(); };
const w = await import('wrangler'); lap('import wrangler');
const { loadPyodide } = await import('pyodide'); lap('import pyodide');
const py = await loadPyodide(); lap('loadPyodide');
const p = await w.getPlatformProxy({ configPath: 'wrangler.toml', persist: false, remoteBindings: false }); lap('proxy');
await p.dispose(); lap('dispose');
