/* One upload of a model's weights per GPU, whatever the number of contexts and schedulers on it: the first
 * executor that runs there uploads them, later ones share them, the last to go frees them. */
#include <pthread.h>

#include "engine/engine.h"

/* Contexts may be made and freed from several threads; making one is rare, so one lock for all models. */
static pthread_mutex_t gpu_lock = PTHREAD_MUTEX_INITIALIZER;

int kiln_model_gpu_acquire(kiln_model *m, kiln_cuda_model **out, kiln_error *err) {
    pthread_mutex_lock(&gpu_lock);
    int rc = 0;
    if (!m->gpu) rc = kiln_cuda_model_load(&m->cfg, &m->w, &m->gpu, err);
    if (!rc) m->gpu_users++;
    *out = rc ? NULL : m->gpu;
    pthread_mutex_unlock(&gpu_lock);
    return rc;
}

void kiln_model_gpu_release(kiln_model *m) {
    pthread_mutex_lock(&gpu_lock);
    if (m->gpu_users > 0 && --m->gpu_users == 0) {
        kiln_cuda_model_free(m->gpu);
        m->gpu = NULL;
    }
    pthread_mutex_unlock(&gpu_lock);
}
