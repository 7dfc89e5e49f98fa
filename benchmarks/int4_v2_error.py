"""Max abs error of the 4-bit decode kernels against the fp32 reference on the CPU (Triton interpreter):
v1, v2 (plain-op path); beside SDPA in fp16 over the same dequantised K/V and the
format's own error (the reference against attention over the unquantised K/V). Random K (x ksc), V, q x 2.

    PYTHONPATH=. python benchmarks/int4_v2_error.py
"""
import os
os.environ["TRITON_INTERPRET"]="1"
import torch, torch.nn.functional as F
from cuda_ops.cross_int4 import *
from cuda_ops.cross_int4 import decode_attention_int4_v2_triton
torch.manual_seed(0)
for (B,T,H,D,S,ksc) in [(3,300,2,64,None,3),(3,300,2,64,None,0.3),(1,129,1,32,2,3),(2,77,3,16,1,3),(1,200,1,128,2,1)]:
    k=torch.randn(B,H,T,D)*ksc; v=torch.randn(B,H,T,D)
    kc,ks=quantize_k(k); vc,vs=quantize_v(v)
    q=(torch.randn(B,H,D)*2).half()
    o=decode_attention_int4_v2_triton(q,kc,vc,ks,vs,num_splits=S).float()
    o1=decode_attention_int4_triton(q,kc,vc,ks,vs,num_splits=S).float()
    r=decode_attention_int4_reference(q,kc,vc,ks,vs).float()
    kk,vv=dequantize_k(kc,ks),dequantize_v(vc,vs)
    sd=F.scaled_dot_product_attention(q.half()[:,:,None],kk.half(),vv.half())[:,:,0].float()
    tr=F.scaled_dot_product_attention(q.float()[:,:,None],k,v)[:,:,0]
    print(B,T,H,D,S,ksc,"v1 err %.2e v2 err %.2e sdpa16 err %.2e quant err %.2e max %.2f"%((o1-r).abs().max(),(o-r).abs().max(),(sd-r).abs().max(),(tr-r).abs().max(),r.abs().max()))
