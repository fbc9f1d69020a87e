/* What the executors on one model share: the model itself (the caller that opened it and every context and
 * scheduler on it hold a reference; the last to let go frees it, so a model may be closed before its contexts) and
 * its weights on the GPU (one upload whatever the number of contexts and schedulers there: the first executor that
 * runs there uploads them, later ones share them, the last to go frees them). */
#include <pthread.h>

#include "engine/engine.h"

/* Contexts may be made and freed from several threads; making one is rare, so one lock for all models. */
static pthread_mutex_t share_lock = PTHREAD_MUTEX_INITIALIZER;

void kiln_model_retain(kiln_model *m) {
    pthread_mutex_lock(&share_lock);
    m->users++;
    pthread_mutex_unlock(&share_lock);
}

void kiln_model_release(kiln_model *m) {
    if (!m) return;
    pthread_mutex_lock(&share_lock);
    bool last = --m->users == 0;
    pthread_mutex_unlock(&share_lock);
    if (last) kiln_model_free(m); /* every holder released its GPU upload before its reference */
}

int kiln_model_gpu_acquire(kiln_model *m, kiln_cuda_model **out, kiln_error *err) {
    pthread_mutex_lock(&share_lock);
    int rc = 0;
    if (!m->gpu) rc = kiln_cuda_model_load(&m->cfg, &m->w, &m->gpu, err);
    if (!rc) m->gpu_users++;
    *out = rc ? NULL : m->gpu;
    pthread_mutex_unlock(&share_lock);
    return rc;
}

void kiln_model_gpu_release(kiln_model *m) {
    pthread_mutex_lock(&share_lock);
    if (m->gpu_users > 0 && --m->gpu_users == 0) {
        kiln_cuda_model_free(m->gpu);
        m->gpu = NULL;
    }
    pthread_mutex_unlock(&share_lock);
}
