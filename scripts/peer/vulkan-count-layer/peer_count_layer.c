/* VK_LAYER_PEER_count: a tiny Vulkan layer that
 *  - counts vkCreateBuffer (and bytes), vkAllocateMemory (and bytes), frees/destroys,
 *    vkQueueSubmit, vkCmdDispatch, compute pipeline creation, and the device memory bytes
 *    live now and at the peak; readable in-process through peer_counters() (ctypes), live
 *    from any process when PEER_COUNT_SHM names a file (the counters are then a shared
 *    mapping of that file: C_NUM little-endian u64 in the order of cname[], zeroed when the
 *    layer loads), and printed at exit when PEER_COUNT_PRINT=1 (or to the file named by
 *    PEER_COUNT_OUT);
 *  - when PEER_SPOOF_IMAGE_ARRAY_INDEXING=1, reports shaderSampledImageArrayDynamicIndexing and
 *    shaderStorageImageArrayDynamicIndexing as supported (and strips them from vkCreateDevice),
 *    so that Dawn accepts Mesa 22.3 lavapipe. ORT's WGSL never indexes arrays of images.
 * Build: gcc -O2 -shared -fPIC -o libpeer_count_layer.so peer_count_layer.c (needs libvulkan-dev;
 *        scripts/bench_peer.sh builds it into target/peer/layer/)
 */
#include <vulkan/vulkan.h>
#include <vulkan/vk_layer.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
enum { C_BUF, C_BUF_BYTES, C_BUF_DESTROY, C_MEM, C_MEM_BYTES, C_MEM_FREE, C_SUBMIT, C_DISPATCH,
       C_PIPE, C_MAP, C_MEM_LIVE, C_MEM_PEAK, C_NUM };
static const char *cname[C_NUM] = {"create_buffer", "create_buffer_bytes", "destroy_buffer",
  "allocate_memory", "allocate_memory_bytes", "free_memory", "queue_submit", "cmd_dispatch",
  "compute_pipelines", "map_memory", "memory_live_bytes", "memory_peak_bytes"};
static _Atomic unsigned long long ctr_private[C_NUM];
static _Atomic unsigned long long *ctr = ctr_private;
/* PEER_COUNT_SHM: the counters live in a shared mapping of that file, so another process (or
 * this one, without linking to the layer) reads them while the program runs. */
__attribute__((constructor)) static void map_counters(void) {
  const char *path = getenv("PEER_COUNT_SHM");
  if (!path || !path[0]) return;
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  size_t len = sizeof(ctr_private);
  if (ftruncate(fd, (off_t)len) == 0) {
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) { memset(m, 0, len); ctr = (_Atomic unsigned long long *)m; }
  }
  close(fd);
}
/* Live device memory: the size of every VkDeviceMemory until it is freed (open addressing). */
#define MEMN 65536
static struct { void *h; unsigned long long size; } mems[MEMN];
static pthread_mutex_t memmu = PTHREAD_MUTEX_INITIALIZER;
static void mem_add(void *h, unsigned long long size) {
  pthread_mutex_lock(&memmu);
  unsigned long long live = (ctr[C_MEM_LIVE] += size);
  if (live > ctr[C_MEM_PEAK]) ctr[C_MEM_PEAK] = live;
  size_t i = ((size_t)h >> 4) % MEMN;
  for (size_t k = 0; k < MEMN; k++, i = (i + 1) % MEMN)
    if (!mems[i].h) { mems[i].h = h; mems[i].size = size; break; }
  pthread_mutex_unlock(&memmu);
}
static void mem_remove(void *h) {
  pthread_mutex_lock(&memmu);
  size_t i = ((size_t)h >> 4) % MEMN;
  for (size_t k = 0; k < MEMN && mems[i].h; k++, i = (i + 1) % MEMN)
    if (mems[i].h == h) {
      ctr[C_MEM_LIVE] -= mems[i].size;
      /* backward-shift deletion keeps the probe chains intact */
      size_t j = i;
      for (;;) {
        j = (j + 1) % MEMN;
        if (!mems[j].h) break;
        size_t home = ((size_t)mems[j].h >> 4) % MEMN;
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j); /* home in (i, j] */
        if (!stays) { mems[i] = mems[j]; i = j; }
      }
      mems[i].h = NULL; mems[i].size = 0;
      break;
    }
  pthread_mutex_unlock(&memmu);
}
EXPORT void peer_counters(unsigned long long *out) { for (int i = 0; i < C_NUM; i++) out[i] = ctr[i]; }
EXPORT int peer_counter_count(void) { return C_NUM; }
EXPORT const char *peer_counter_name(int i) { return i >= 0 && i < C_NUM ? cname[i] : ""; }

static int spoof(void) { const char *e = getenv("PEER_SPOOF_IMAGE_ARRAY_INDEXING"); return e && e[0] == '1'; }

typedef struct { void *key; PFN_vkGetInstanceProcAddr gipa; PFN_vkDestroyInstance destroy;
  PFN_vkGetPhysicalDeviceFeatures gf; PFN_vkGetPhysicalDeviceFeatures2 gf2, gf2khr; } Inst;
typedef struct { void *key; PFN_vkGetDeviceProcAddr gdpa; PFN_vkDestroyDevice destroy;
  PFN_vkCreateBuffer cb; PFN_vkDestroyBuffer db; PFN_vkAllocateMemory am; PFN_vkFreeMemory fm;
  PFN_vkQueueSubmit qs; PFN_vkQueueSubmit2 qs2; PFN_vkCmdDispatch cd; PFN_vkCmdDispatchIndirect cdi;
  PFN_vkCreateComputePipelines ccp; PFN_vkMapMemory mm; } Dev;
#define MAXN 64
static Inst insts[MAXN]; static Dev devs[MAXN]; static int ninst, ndev;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static void *key(const void *h) { return *(void **)h; }
static Inst *inst_of(const void *h) { void *k = key(h); for (int i = ninst - 1; i >= 0; i--) if (insts[i].key == k) return &insts[i]; return NULL; }
static Dev *dev_of(const void *h) { void *k = key(h); for (int i = ndev - 1; i >= 0; i--) if (devs[i].key == k) return &devs[i]; return NULL; }

static VKAPI_ATTR VkResult VKAPI_CALL L_CreateInstance(const VkInstanceCreateInfo *ci, const VkAllocationCallbacks *a, VkInstance *out) {
  VkLayerInstanceCreateInfo *li = (VkLayerInstanceCreateInfo *)ci->pNext;
  while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO)) li = (VkLayerInstanceCreateInfo *)li->pNext;
  if (!li) return VK_ERROR_INITIALIZATION_FAILED;
  PFN_vkGetInstanceProcAddr gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  li->u.pLayerInfo = li->u.pLayerInfo->pNext;
  PFN_vkCreateInstance create = (PFN_vkCreateInstance)gipa(VK_NULL_HANDLE, "vkCreateInstance");
  VkResult r = create(ci, a, out);
  if (r != VK_SUCCESS) return r;
  pthread_mutex_lock(&mu);
  if (ninst < MAXN) { Inst *I = &insts[ninst++]; I->key = key(*out); I->gipa = gipa;
    I->destroy = (PFN_vkDestroyInstance)gipa(*out, "vkDestroyInstance");
    I->gf = (PFN_vkGetPhysicalDeviceFeatures)gipa(*out, "vkGetPhysicalDeviceFeatures");
    I->gf2 = (PFN_vkGetPhysicalDeviceFeatures2)gipa(*out, "vkGetPhysicalDeviceFeatures2");
    I->gf2khr = (PFN_vkGetPhysicalDeviceFeatures2)gipa(*out, "vkGetPhysicalDeviceFeatures2KHR"); }
  pthread_mutex_unlock(&mu);
  return r;
}
static VKAPI_ATTR void VKAPI_CALL L_DestroyInstance(VkInstance i, const VkAllocationCallbacks *a) { Inst *I = inst_of(i); if (I && I->destroy) I->destroy(i, a); }
static void patch(VkPhysicalDeviceFeatures *f) { if (spoof()) { f->shaderSampledImageArrayDynamicIndexing = VK_TRUE; f->shaderStorageImageArrayDynamicIndexing = VK_TRUE; } }
static VKAPI_ATTR void VKAPI_CALL L_GetPhysicalDeviceFeatures(VkPhysicalDevice p, VkPhysicalDeviceFeatures *f) { Inst *I = inst_of(p); I->gf(p, f); patch(f); }
static VKAPI_ATTR void VKAPI_CALL L_GetPhysicalDeviceFeatures2(VkPhysicalDevice p, VkPhysicalDeviceFeatures2 *f) { Inst *I = inst_of(p); (I->gf2 ? I->gf2 : I->gf2khr)(p, f); patch(&f->features); }
static VKAPI_ATTR void VKAPI_CALL L_GetPhysicalDeviceFeatures2KHR(VkPhysicalDevice p, VkPhysicalDeviceFeatures2 *f) { Inst *I = inst_of(p); (I->gf2khr ? I->gf2khr : I->gf2)(p, f); patch(&f->features); }

static VKAPI_ATTR VkResult VKAPI_CALL L_CreateDevice(VkPhysicalDevice p, const VkDeviceCreateInfo *ci, const VkAllocationCallbacks *a, VkDevice *out) {
  VkLayerDeviceCreateInfo *li = (VkLayerDeviceCreateInfo *)ci->pNext;
  while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO)) li = (VkLayerDeviceCreateInfo *)li->pNext;
  if (!li) return VK_ERROR_INITIALIZATION_FAILED;
  PFN_vkGetInstanceProcAddr gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  PFN_vkGetDeviceProcAddr gdpa = li->u.pLayerInfo->pfnNextGetDeviceProcAddr;
  li->u.pLayerInfo = li->u.pLayerInfo->pNext;
  PFN_vkCreateDevice create = (PFN_vkCreateDevice)gipa(VK_NULL_HANDLE, "vkCreateDevice");
  if (!create) { Inst *I = inst_of(p); create = (PFN_vkCreateDevice)I->gipa(VK_NULL_HANDLE, "vkCreateDevice"); }
  /* strip spoofed features (restored after the call) */
  VkPhysicalDeviceFeatures *f = (VkPhysicalDeviceFeatures *)ci->pEnabledFeatures;
  for (const VkBaseInStructure *s = ci->pNext; !f && s; s = s->pNext)
    if (s->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2) f = &((VkPhysicalDeviceFeatures2 *)s)->features;
  VkBool32 s1 = 0, s2 = 0;
  if (f && spoof()) { s1 = f->shaderSampledImageArrayDynamicIndexing; s2 = f->shaderStorageImageArrayDynamicIndexing;
    f->shaderSampledImageArrayDynamicIndexing = VK_FALSE; f->shaderStorageImageArrayDynamicIndexing = VK_FALSE; }
  VkResult r = create(p, ci, a, out);
  if (f && spoof()) { f->shaderSampledImageArrayDynamicIndexing = s1; f->shaderStorageImageArrayDynamicIndexing = s2; }
  if (r != VK_SUCCESS) return r;
  pthread_mutex_lock(&mu);
  if (ndev < MAXN) { Dev *D = &devs[ndev++]; VkDevice d = *out; D->key = key(d); D->gdpa = gdpa;
#define G(field, name) D->field = (void *)gdpa(d, name)
    G(destroy, "vkDestroyDevice"); G(cb, "vkCreateBuffer"); G(db, "vkDestroyBuffer"); G(am, "vkAllocateMemory");
    G(fm, "vkFreeMemory"); G(qs, "vkQueueSubmit"); G(qs2, "vkQueueSubmit2"); if (!D->qs2) G(qs2, "vkQueueSubmit2KHR");
    G(cd, "vkCmdDispatch"); G(cdi, "vkCmdDispatchIndirect"); G(ccp, "vkCreateComputePipelines"); G(mm, "vkMapMemory"); }
  pthread_mutex_unlock(&mu);
  return r;
}
static VKAPI_ATTR void VKAPI_CALL L_DestroyDevice(VkDevice d, const VkAllocationCallbacks *a) { Dev *D = dev_of(d); if (D && D->destroy) D->destroy(d, a); }
static VKAPI_ATTR VkResult VKAPI_CALL L_CreateBuffer(VkDevice d, const VkBufferCreateInfo *ci, const VkAllocationCallbacks *a, VkBuffer *b) {
  ctr[C_BUF]++; ctr[C_BUF_BYTES] += ci->size; return dev_of(d)->cb(d, ci, a, b); }
static VKAPI_ATTR void VKAPI_CALL L_DestroyBuffer(VkDevice d, VkBuffer b, const VkAllocationCallbacks *a) { if (b) ctr[C_BUF_DESTROY]++; dev_of(d)->db(d, b, a); }
static VKAPI_ATTR VkResult VKAPI_CALL L_AllocateMemory(VkDevice d, const VkMemoryAllocateInfo *ai, const VkAllocationCallbacks *a, VkDeviceMemory *m) {
  ctr[C_MEM]++; ctr[C_MEM_BYTES] += ai->allocationSize; VkResult r = dev_of(d)->am(d, ai, a, m);
  if (r == VK_SUCCESS) mem_add((void *)*m, ai->allocationSize);
  return r; }
static VKAPI_ATTR void VKAPI_CALL L_FreeMemory(VkDevice d, VkDeviceMemory m, const VkAllocationCallbacks *a) { if (m) { ctr[C_MEM_FREE]++; mem_remove((void *)m); } dev_of(d)->fm(d, m, a); }
static VKAPI_ATTR VkResult VKAPI_CALL L_MapMemory(VkDevice d, VkDeviceMemory m, VkDeviceSize o, VkDeviceSize s, VkMemoryMapFlags fl, void **pp) { ctr[C_MAP]++; return dev_of(d)->mm(d, m, o, s, fl, pp); }
static VKAPI_ATTR VkResult VKAPI_CALL L_QueueSubmit(VkQueue q, uint32_t n, const VkSubmitInfo *s, VkFence f) { ctr[C_SUBMIT]++; return dev_of(q)->qs(q, n, s, f); }
static VKAPI_ATTR VkResult VKAPI_CALL L_QueueSubmit2(VkQueue q, uint32_t n, const VkSubmitInfo2 *s, VkFence f) { ctr[C_SUBMIT]++; return dev_of(q)->qs2(q, n, s, f); }
static VKAPI_ATTR void VKAPI_CALL L_CmdDispatch(VkCommandBuffer c, uint32_t x, uint32_t y, uint32_t z) { ctr[C_DISPATCH]++; dev_of(c)->cd(c, x, y, z); }
static VKAPI_ATTR void VKAPI_CALL L_CmdDispatchIndirect(VkCommandBuffer c, VkBuffer b, VkDeviceSize o) { ctr[C_DISPATCH]++; dev_of(c)->cdi(c, b, o); }
static VKAPI_ATTR VkResult VKAPI_CALL L_CreateComputePipelines(VkDevice d, VkPipelineCache pc, uint32_t n, const VkComputePipelineCreateInfo *ci, const VkAllocationCallbacks *a, VkPipeline *p) {
  ctr[C_PIPE] += n; return dev_of(d)->ccp(d, pc, n, ci, a, p); }

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL peer_GetDeviceProcAddr(VkDevice d, const char *n);
#define DEVFN(name, fn, field) if (!strcmp(n, name)) { Dev *D = d ? dev_of(d) : NULL; if (D && !D->field) return NULL; return (PFN_vkVoidFunction)fn; }
EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL peer_GetDeviceProcAddr(VkDevice d, const char *n) {
  if (!strcmp(n, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)peer_GetDeviceProcAddr;
  DEVFN("vkDestroyDevice", L_DestroyDevice, destroy) DEVFN("vkCreateBuffer", L_CreateBuffer, cb)
  DEVFN("vkDestroyBuffer", L_DestroyBuffer, db) DEVFN("vkAllocateMemory", L_AllocateMemory, am)
  DEVFN("vkFreeMemory", L_FreeMemory, fm) DEVFN("vkQueueSubmit", L_QueueSubmit, qs)
  DEVFN("vkQueueSubmit2", L_QueueSubmit2, qs2) DEVFN("vkQueueSubmit2KHR", L_QueueSubmit2, qs2)
  DEVFN("vkCmdDispatch", L_CmdDispatch, cd) DEVFN("vkCmdDispatchIndirect", L_CmdDispatchIndirect, cdi)
  DEVFN("vkCreateComputePipelines", L_CreateComputePipelines, ccp) DEVFN("vkMapMemory", L_MapMemory, mm)
  if (!d) return NULL;
  Dev *D = dev_of(d);
  return D ? D->gdpa(d, n) : NULL;
}
EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL peer_GetInstanceProcAddr(VkInstance i, const char *n) {
  if (!strcmp(n, "vkGetInstanceProcAddr")) return (PFN_vkVoidFunction)peer_GetInstanceProcAddr;
  if (!strcmp(n, "vkCreateInstance")) return (PFN_vkVoidFunction)L_CreateInstance;
  if (!strcmp(n, "vkDestroyInstance")) return (PFN_vkVoidFunction)L_DestroyInstance;
  if (!strcmp(n, "vkCreateDevice")) return (PFN_vkVoidFunction)L_CreateDevice;
  if (!strcmp(n, "vkGetPhysicalDeviceFeatures")) return (PFN_vkVoidFunction)L_GetPhysicalDeviceFeatures;
  if (!strcmp(n, "vkGetPhysicalDeviceFeatures2")) return (PFN_vkVoidFunction)L_GetPhysicalDeviceFeatures2;
  if (!strcmp(n, "vkGetPhysicalDeviceFeatures2KHR")) return (PFN_vkVoidFunction)L_GetPhysicalDeviceFeatures2KHR;
  if (i == VK_NULL_HANDLE) return NULL;
  PFN_vkVoidFunction f = peer_GetDeviceProcAddr(VK_NULL_HANDLE, n);
  if (f && strcmp(n, "vkGetDeviceProcAddr")) { /* device functions: only if the next layer has them */
    Inst *I = inst_of(i); if (I && I->gipa(i, n)) return f; }
  if (!strcmp(n, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)peer_GetDeviceProcAddr;
  Inst *I = inst_of(i); return I ? I->gipa(i, n) : NULL;
}
EXPORT VKAPI_ATTR VkResult VKAPI_CALL vkNegotiateLoaderLayerInterfaceVersion(VkNegotiateLayerInterface *v) {
  if (v->loaderLayerInterfaceVersion > 2) v->loaderLayerInterfaceVersion = 2;
  v->pfnGetInstanceProcAddr = peer_GetInstanceProcAddr; v->pfnGetDeviceProcAddr = peer_GetDeviceProcAddr;
  v->pfnGetPhysicalDeviceProcAddr = NULL; return VK_SUCCESS;
}
__attribute__((destructor)) static void report(void) {
  const char *p = getenv("PEER_COUNT_PRINT"), *o = getenv("PEER_COUNT_OUT");
  if (!(p && p[0] == '1') && !o) return;
  FILE *f = o ? fopen(o, "a") : stderr; if (!f) return;
  fprintf(f, "{\"layer\":\"VK_LAYER_PEER_count\"");
  for (int i = 0; i < C_NUM; i++) fprintf(f, ",\"%s\":%llu", cname[i], (unsigned long long)ctr[i]);
  fprintf(f, "}\n"); if (o) fclose(f);
}
