#!/bin/bash
# Run a command with ONNX Runtime's WebGPU plugin EP usable on a GPU-less Linux box
# (scripts/bench_peer.sh's native route).
#   PEER_ICD=swiftshader (default) | lavapipe | system (the machine's own Vulkan drivers: a
#   real GPU; the fake DRM entry only where /sys/class/drm has no device of its own)
# 1. A private mount namespace with a fake /sys/class/drm/card0/device/{vendor,device}:
#    ORT's device discovery only offers the WebGPU EP a GPU device when one exists there.
# 2. swiftshader: Vulkan loader pointed at Debian chromium's SwiftShader ICD
#    (/usr/lib/chromium/libvk_swiftshader.so, "SwiftShader Device (Subzero)").
#    lavapipe: Mesa 22.3.6 lavapipe plus vulkan-count-layer/ (VK_LAYER_PEER_count) with
#    PEER_SPOOF_IMAGE_ARRAY_INDEXING=1 (Dawn otherwise rejects lavapipe: "Vulkan
#    shaderUniform*ArrayDynamicIndexing required"; lavapipe lacks the *Image* variants).
# 3. PEER_COUNT=1 (implied by lavapipe) loads VK_LAYER_PEER_count, which counts
#    vkCreateBuffer/vkAllocateMemory/vkQueueSubmit/vkCmdDispatch (see vulkan-count-layer/peer_count_layer.c),
#    from PEER_LAYER_DIR (default target/peer/layer, where scripts/bench_peer.sh builds it).
# Needs root (unshare -m, mount).
HERE=$(cd "$(dirname "$0")" && pwd)
LAYER_DIR=${PEER_LAYER_DIR:-$HERE/../../target/peer/layer}
case "${PEER_ICD:-swiftshader}" in
  swiftshader) export VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json ;;
  lavapipe) export VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
            export PEER_SPOOF_IMAGE_ARRAY_INDEXING=1 PEER_COUNT=1 ;;
  system) ;;
  *) echo "PEER_ICD must be swiftshader, lavapipe or system" >&2; exit 2 ;;
esac
if [ "${PEER_COUNT:-0}" = 1 ]; then
  export VK_LAYER_PATH=$LAYER_DIR VK_INSTANCE_LAYERS=VK_LAYER_PEER_count VK_LOADER_DEBUG=none
fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
if [ "${PEER_ICD:-swiftshader}" = system ] && ls /sys/class/drm/card*/device/vendor >/dev/null 2>&1; then
  exec "$@"
fi
exec unshare -m bash -c 'mount -t tmpfs none /sys/class && mkdir -p /sys/class/drm/card0/device && echo 0x10de > /sys/class/drm/card0/device/vendor && echo 0x2330 > /sys/class/drm/card0/device/device && exec "$@"' _ "$@"
