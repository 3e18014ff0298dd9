#!/usr/bin/env python3
"""Checks that src/ has no module cycle: at the file level (a child using its parent's items
is the module tree, not a cycle) and between top-level modules. Prints the graph without -q.
Usage: python3 .ci/modgraph.py file|top [-q]"""
import re,os,sys,glob
root=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'src')
files=[f for f in glob.glob(root+'/**/*.rs',recursive=True)]
def modof(f):
    rel=os.path.relpath(f,root)[:-3]
    parts=rel.split('/')
    if parts[-1]=='mod': parts=parts[:-1]
    return '/'.join(parts)
mods={modof(f):f for f in files}
# root re-exports: name -> module
lib=open(root+'/lib.rs').read()
reexp={}
for m in re.finditer(r'pub use (\w+)::(\{[^}]*\}|\w+);',lib):
    for n in re.findall(r'\w+',m.group(2)): reexp[n]=m.group(1)
level=sys.argv[1] if len(sys.argv)>1 else 'file'
quiet='-q' in sys.argv
def key(m):
    return m if level=='file' else m.split('/')[0]
edges={}
for m,f in mods.items():
    if m=='lib': continue
    src=open(f).read()
    # strip comments and test modules
    code=re.sub(r'//[^\n]*','',src)
    code=re.split(r'#\[cfg\((all\()?test',code)[0]
    deps=set()
    for t in re.findall(r'crate::(\w+)',code):
        if t in mods or any(k.split('/')[0]==t for k in mods): deps.add(t)
        elif t in reexp: deps.add(reexp[t])
    parent='/'.join(m.split('/')[:-1])
    grand='/'.join(m.split('/')[:-2])
    # `super::super::x` (a grandchild reaching a sibling of its parent), then `super::x`.
    for t in re.findall(r'super::super::(\w+)',code):
        if grand and (grand+'/'+t) in mods: deps.add(grand+'/'+t)
        elif grand: deps.add(grand)
    code_s=re.sub(r'super::super::\w+','',code)
    for t in re.findall(r'super::(\w+)',code_s):
        if parent and (parent+'/'+t) in mods: deps.add(parent+'/'+t)
        elif parent: deps.add(parent)
    if re.search(r'\bsuper::\{',code) and parent: deps.add(parent)
    # A parent's references to its own child modules (`mod table; use table::...`).
    for c in mods:
        if c.startswith(m+'/') and '/' not in c[len(m)+1:]:
            if re.search(r'(?<![\w:])'+re.escape(c.split('/')[-1])+r'::',code): deps.add(c)
    km=key(m)
    for d in deps:
        kd=key(d)
        # A child using its parent's items (the parent is the module's interface: the
        # trait it re-exports, a shared helper) is the module tree, not a cycle.
        if kd!=km and not km.startswith(kd+'/'): edges.setdefault(km,set()).add(kd)
# cycle detection (Tarjan)
index={};low={};st=[];on=set();sccs=[];i=[0]
def sc(v):
    index[v]=low[v]=i[0];i[0]+=1;st.append(v);on.add(v)
    for w in edges.get(v,()):
        if w not in index: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],index[w])
    if low[v]==index[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        sccs.append(comp)
nodes=set(edges)|{d for v in edges.values() for d in v}
for v in sorted(nodes):
    if v not in index: sc(v)
cyc=[c for c in sccs if len(c)>1]
if not quiet:
    for v in sorted(edges): print(v,'->',' '.join(sorted(edges[v])))
print(level, 'level: cycles:', cyc if cyc else 'none')
# The Redis wing's spine: the hybrid limiter reaches Redis through the connection module, never
# through a client (the sync `blocking` or the async `aio` one).
bad=[] if level!='file' else [(v,d) for v in edges if v.startswith('redis/hybrid') for d in edges[v] if d in ('redis/blocking','redis/aio')]
if bad: print('the hybrid imports a client module:', bad)
sys.exit(1 if cyc or bad else 0)
