"""Rewrites every `kernel<<<grid, block>>>(args)` launch of a .cu file into `EmuLaunch(grid, block, threaded,
[&] { kernel(args); })` for the host emulation of the FakeQuant CUDA kernels (fake/cuda_runtime.h).

    python transform.py <in.cu> <out.cc>
"""
import re,sys
s=open(sys.argv[1]).read()
out=[];i=0
while True:
    k=s.find('<<<',i)
    if k<0: out.append(s[i:]); break
    # kernel name: back from k over identifier and optional template args
    j=k
    if s[j-1]=='>':
        depth=0
        while True:
            j-=1
            if s[j]=='>': depth+=1
            elif s[j]=='<':
                depth-=1
                if depth==0: break
    m=re.search(r'[A-Za-z_][A-Za-z_0-9]*$',s[:j]); j=m.start()
    name=s[j:k]
    e=s.find('>>>',k); cfg=[c.strip() for c in s[k+3:e].split(',')]
    # args: balanced parens from e+3
    p=e+3; assert s[p]=='('; depth=0; q=p
    while True:
        if s[q]=='(': depth+=1
        elif s[q]==')':
            depth-=1
            if depth==0: break
        q+=1
    args=s[p+1:q]
    threaded='true' if 'Combine' in name else 'false'
    out.append(s[i:j]); out.append(f'EmuLaunch({cfg[0]}, {cfg[1]}, {threaded}, [&] {{ {name}({args}); }})')
    i=q+1
open(sys.argv[2],'w').write(''.join(out))
