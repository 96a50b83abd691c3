// A rank that throws while the others wait in a collective: run_or_abort writes the error with
// the rank and ends every rank (MPI_Abort), so that mpirun returns instead of hanging. ctest
// runs it on 2 ranks with a timeout and looks for the message.
#include <dimsum/dimsum.hpp>
#include <dimsum/dist/group.hpp>

namespace ds = dimsum;
namespace dist = dimsum::dist;

int main(int argc, char** argv) {
    dist::session mpi(argc, argv);
    const dist::group world = dist::group::world();
    dist::run_or_abort(world, [&] {
        using Rows = ds::axis<"rows">;
        ds::tensor<double, Rows> x(Rows{4});
        if (world.rank() == 1) throw ds::shape_error("dimsum: a mistake made on rank 1 only");
        dist::all_reduce(world, x);  // rank 0 waits here for a rank that will never come
    });
    return 0;
}
